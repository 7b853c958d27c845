"""Findings and check results: what checks produce and reports render.

A check never prints. It returns a :class:`CheckResult` holding typed :class:`Finding` objects
with everything a person needs to act: the subject (file, key, rank), expected vs actual, and
a hint naming the next command to run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class Severity(str, Enum):
    ERROR = "error"
    """The checkpoint cannot be (fully) restored or resumed: the drill fails."""
    WARNING = "warning"
    """Restorable, but something a resume may suffer from; the drill still passes."""
    INFO = "info"


class CheckStatus(str, Enum):
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    check: str
    """Name of the check that produced it."""
    code: str
    """Stable identifier, e.g. ``file-missing``; tests and alert rules match on it."""
    severity: Severity
    message: str
    """One sentence saying what is wrong and what a resume would suffer."""
    subject: str | None = None
    """The file, key path or part concerned."""
    rank: int | None = None
    expected: Any = None
    actual: Any = None
    hint: str | None = None
    """What to run or do next."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["severity"] = self.severity.value
        return {k: v for k, v in d.items() if v is not None}


@dataclass(slots=True, kw_only=True)
class CheckResult:
    name: str
    summary: str
    """What the check proved (or could not prove), in one line, for the audit trail."""
    findings: list[Finding] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    skipped: bool = False

    @property
    def status(self) -> CheckStatus:
        if self.skipped:
            return CheckStatus.SKIPPED
        if any(f.severity is Severity.ERROR for f in self.findings):
            return CheckStatus.FAILED
        return CheckStatus.PASSED

    def evidence_document(self) -> dict[str, Any]:
        """The JSON stored with the check: its evidence plus its findings."""
        return {**self.evidence, "findings": [f.to_dict() for f in self.findings]}
