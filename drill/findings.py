"""Findings and check results: what checks produce and reports render.

A check never prints. It returns a :class:`CheckResult` holding typed :class:`Finding` objects
with everything a person needs to act: the subject (file, key, rank), expected vs actual, and
a hint naming the next command to run.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from drill.text import lossless


class Severity(str, Enum):
    ERROR = "error"
    """The checkpoint cannot be (fully) restored or resumed: the drill fails."""
    WARNING = "warning"
    """Restorable, but something a resume may suffer from; the drill still passes."""
    INFO = "info"


class CheckStatus(str, Enum):
    PASSED = "passed"
    FAILED = "failed"
    """The check found a problem with the checkpoint."""
    SKIPPED = "skipped"
    """The check could not run (a gap in the evidence, never a pass)."""
    ERROR = "error"
    """The check could not finish because drill itself (or a replay harness) failed."""


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

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Finding:
        known = {k: doc.get(k) for k in ("check", "code", "message", "subject", "rank", "expected", "actual", "hint")}
        return cls(severity=Severity(doc["severity"]), **known)  # type: ignore[arg-type]


PER_CODE = 100
"""Findings of one code a check keeps: the first 99, then one that counts the rest. A file
whose header lists 200,000 overlapping entries, a seal naming a million missing files, is a
report a person reads and a record a database holds — not 200,000 lines."""


def bounded(findings: list[Finding], per_code: int = PER_CODE) -> list[Finding]:
    """``findings`` with at most ``per_code`` of each code: past that, the first ``per_code - 1``
    in order and one finding, of the gravest severity among the rest, counting them. Bounded
    findings stay as they are (bounding twice changes nothing)."""
    if len(findings) <= per_code:
        return findings
    counts: dict[str, int] = {}
    for f in findings:
        counts[f.code] = counts.get(f.code, 0) + 1
    if max(counts.values()) <= per_code:
        return findings
    kept: list[Finding] = []
    rest: dict[str, list[Finding]] = {}
    seen: dict[str, int] = {}
    for f in findings:
        seen[f.code] = n = seen.get(f.code, 0) + 1
        if counts[f.code] <= per_code or n < per_code:
            kept.append(f)
        else:
            rest.setdefault(f.code, []).append(f)
    for code, more in rest.items():
        grave = min(more, key=lambda f: _GRAVITY[f.severity])
        kept.append(
            Finding(
                check=grave.check,
                code=code,
                severity=grave.severity,
                message=f"and {len(more)} more {code} findings like those above ({counts[code]} in all)",
                hint=grave.hint,
            )
        )
    return kept


_GRAVITY = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}


@dataclass(slots=True, kw_only=True)
class CheckResult:
    name: str
    summary: str
    """What the check proved (or could not prove), in one line, for the audit trail."""
    findings: list[Finding] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    skipped: bool = False
    errored: bool = False

    def __post_init__(self) -> None:
        self.findings = bounded(self.findings)

    @property
    def status(self) -> CheckStatus:
        """drill's own failure, then a problem found, then a gap: a check that could not prove
        its claim but did find something wrong has failed."""
        if self.errored:
            return CheckStatus.ERROR
        if any(f.severity is Severity.ERROR for f in self.findings):
            return CheckStatus.FAILED
        if self.skipped:
            return CheckStatus.SKIPPED
        return CheckStatus.PASSED

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.ERROR]

    def to_dict(self) -> dict[str, Any]:
        """The check in a drill's outcome document (JSON-ready)."""
        return {
            "name": self.name,
            "status": self.status.value,
            "summary": self.summary,
            "seconds": self.seconds,
            "findings": [jsonable(f.to_dict()) for f in self.findings],
            "evidence": jsonable(self.evidence),
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> CheckResult:
        return cls(
            name=doc["name"],
            summary=doc["summary"],
            findings=[Finding.from_dict(f) for f in doc.get("findings", [])],
            evidence=dict(doc.get("evidence") or {}),
            seconds=float(doc.get("seconds") or 0.0),
            skipped=doc.get("status") == CheckStatus.SKIPPED.value,
            errored=doc.get("status") == CheckStatus.ERROR.value,
        )


def not_run(name: str, why: str) -> CheckResult:
    """A check that could not run in this drill: a gap in the evidence, never a pass."""
    return CheckResult(name=name, summary=f"not checked: {why}", skipped=True, evidence={"not_checked": why})


def strict_json(value: Any, **dumps: Any) -> str:
    """``value`` as strict JSON text for others to parse (stdout, reports, alert receivers):
    :func:`jsonable` first, so a non-finite number is ``"NaN"``/``"Infinity"``, never the bare
    ``Infinity`` that ``jq`` and strict parsers reject."""
    return json.dumps(jsonable(value), allow_nan=False, **dumps)


def jsonable(value: Any) -> Any:
    """Plain JSON on every backend: tuples to lists, keys to strings, NaN/±Inf to the strings
    ``"NaN"``/``"Infinity"``/``"-Infinity"`` (PostgreSQL's json and strict JSON parsers reject
    them as numbers), text that is not UTF-8 (a file name's stray bytes) to ``\\xNN`` escapes,
    anything exotic to its ``str``."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, str):
        return lossless(value)
    if value is None or isinstance(value, (int, float, bool)):
        return value
    if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:  # a 0-d tensor
        return jsonable(value.item())
    return str(value)
