"""A drill's status and exit code: the one verdict rule, written once.

- A failed check makes the drill ``failed`` (exit 1) whatever happened after it — a replay
  that could not run, or even one of drill's own errors, does not hide a broken checkpoint.
  A drill that found nothing to restore is ``failed`` too, with exit 3.
- ``error`` (exit 5) is for failures that are not the checkpoint's: drill's own (an unexpected
  exception, a replay entrypoint that raised, a child process that died, a record that could
  not be written) and the infrastructure's (a check that could not judge because the storage
  refused drill or kept failing).
- ``slo_breach`` (exit 6): every check passed but restore latency or time to first step
  missed the policy's target.
- ``aborted``: interrupted by SIGINT (exit 130) or SIGTERM (exit 143).
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from drill.errors import ExitCode
from drill.findings import CheckResult, CheckStatus, Severity


class DrillStatus(str, Enum):
    RUNNING = "running"
    """In progress; a crash leaves it there as a visible trace until it is reconciled."""
    PASSED = "passed"
    FAILED = "failed"
    SLO_BREACH = "slo_breach"
    ERROR = "error"
    ABORTED = "aborted"

    def __str__(self) -> str:
        return self.value


FINAL = tuple(s for s in DrillStatus if s is not DrillStatus.RUNNING)

NOTHING_TO_DRILL_CODES = frozenset({"no-checkpoint"})
"""Finding codes that mean there was nothing to restore (exit 3, not 1)."""

_EXIT = {
    DrillStatus.PASSED: ExitCode.PASSED,
    DrillStatus.FAILED: ExitCode.FAILED,
    DrillStatus.SLO_BREACH: ExitCode.SLO_BREACH,
    DrillStatus.ERROR: ExitCode.ERROR,
    DrillStatus.ABORTED: ExitCode.INTERRUPTED,
    DrillStatus.RUNNING: ExitCode.ERROR,
}


EXIT_CODES: dict[DrillStatus, frozenset[ExitCode]] = {
    DrillStatus.PASSED: frozenset({ExitCode.PASSED}),
    DrillStatus.FAILED: frozenset({ExitCode.FAILED, ExitCode.NOTHING_TO_DRILL}),
    DrillStatus.SLO_BREACH: frozenset({ExitCode.SLO_BREACH}),
    DrillStatus.ERROR: frozenset({ExitCode.ERROR}),
    DrillStatus.ABORTED: frozenset({ExitCode.INTERRUPTED, ExitCode.TERMINATED}),
    DrillStatus.RUNNING: frozenset(),
}
"""Every exit code a drill that ended with each status can have (:func:`exit_code_for` gives
one of them): a status and a code that disagree are no verdict of drill's."""


def consistent(status: str, code: int) -> bool:
    """Whether a drill could have ended with ``status`` and exit ``code``."""
    try:
        return code in EXIT_CODES[DrillStatus(status)]
    except ValueError:
        return False


def exit_code_for(status: DrillStatus | str, *, signum: int | None = None, nothing_to_drill: bool = False) -> ExitCode:
    """The process exit code of a drill that ended with ``status``."""
    status = DrillStatus(status)
    if status is DrillStatus.ABORTED and signum == signal.SIGTERM:
        return ExitCode.TERMINATED
    if status is DrillStatus.FAILED and nothing_to_drill:
        return ExitCode.NOTHING_TO_DRILL
    return _EXIT[status]


@dataclass(frozen=True, slots=True)
class Verdict:
    status: DrillStatus
    exit_code: ExitCode
    message: str | None
    """Why the drill did not pass, in one line; None when it passed."""


def decide(
    checks: Iterable[CheckResult],
    *,
    drill_error: str | None = None,
    replay_error: str | None = None,
    slo_breaches: Mapping[str, Mapping[str, Any]] | None = None,
    interrupted_by: int | None = None,
) -> Verdict:
    """The drill's verdict from its checks and what happened to drill itself."""
    if interrupted_by is not None:
        name = (
            signal.Signals(interrupted_by).name
            if interrupted_by in signal.Signals._value2member_map_
            else str(interrupted_by)
        )
        return Verdict(
            DrillStatus.ABORTED, exit_code_for(DrillStatus.ABORTED, signum=interrupted_by), f"interrupted by {name}"
        )
    failed = [c for c in checks if c.status is CheckStatus.FAILED]
    if failed:
        first = next((f for c in failed for f in c.findings if f.severity is Severity.ERROR), None)
        nothing = first is not None and first.code in NOTHING_TO_DRILL_CODES
        message = first.message if first is not None else f"{failed[0].name}: {failed[0].summary}"
        return Verdict(DrillStatus.FAILED, exit_code_for(DrillStatus.FAILED, nothing_to_drill=nothing), message)
    if drill_error is not None:
        return Verdict(DrillStatus.ERROR, ExitCode.ERROR, drill_error)
    errored = [c for c in checks if c.status is CheckStatus.ERROR and c.name != "replay"]  # the replay says so itself
    if errored:
        first = next((f for f in errored[0].findings if f.severity is Severity.ERROR), None)
        return Verdict(
            DrillStatus.ERROR, ExitCode.ERROR, first.message if first else f"{errored[0].name}: {errored[0].summary}"
        )
    if replay_error is not None:
        return Verdict(DrillStatus.ERROR, ExitCode.ERROR, f"replay: {replay_error}")
    if slo_breaches:
        return Verdict(
            DrillStatus.SLO_BREACH, ExitCode.SLO_BREACH, "; ".join(str(b["message"]) for b in slo_breaches.values())
        )
    return Verdict(DrillStatus.PASSED, ExitCode.PASSED, None)


@dataclass(frozen=True, slots=True, kw_only=True)
class SLO:
    """A policy's service-level objectives for a drill."""

    max_restore_seconds: float | None = None
    """Restore latency (discover + read + load) above this is an SLO breach."""
    max_ttfs_seconds: float | None = None
    """Time to first step (drill start → first replayed step done) above this is an SLO breach."""

    def __post_init__(self) -> None:
        for name in ("max_restore_seconds", "max_ttfs_seconds"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive, not {value!r}")

    def breaches(self, restore: float | None, ttfs: float | None) -> dict[str, dict[str, Any]]:
        """The targets this drill missed (empty when none)."""
        out: dict[str, dict[str, Any]] = {}
        if self.max_restore_seconds is not None and restore is not None and restore > self.max_restore_seconds:
            out["restore"] = {
                "target": self.max_restore_seconds,
                "actual": restore,
                "message": f"restore took {restore:.2f} s, over the {self.max_restore_seconds:g} s target",
            }
        # Time to first step is measured by a replay; a drill that could not replay (a run's
        # final save, replay switched off) has not missed the target, it has not measured it:
        # a gap that describe() names, never a breach.
        if self.max_ttfs_seconds is not None and ttfs is not None:
            if ttfs > self.max_ttfs_seconds:
                out["ttfs"] = {
                    "target": self.max_ttfs_seconds,
                    "actual": ttfs,
                    "message": f"time to first step {ttfs:.2f} s, over the {self.max_ttfs_seconds:g} s target",
                }
        return out

    def to_dict(self) -> dict[str, float | None]:
        return {"max_restore_seconds": self.max_restore_seconds, "max_ttfs_seconds": self.max_ttfs_seconds}

    def describe(self, restore: float | None, ttfs: float | None) -> str:
        """Each target against what the drill measured: met, missed, or not measured."""
        parts = []
        for what, target, actual in (
            ("restore", self.max_restore_seconds, restore),
            ("time to first step", self.max_ttfs_seconds, ttfs),
        ):
            if target is None:
                continue
            if actual is None:
                parts.append(f"{what}: not measured (target {target:g} s)")
            else:
                parts.append(f"{what} {actual:.2f} s {'over' if actual > target else 'within'} the {target:g} s target")
        return "; ".join(parts) or "no SLO set"
