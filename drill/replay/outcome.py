"""What a replay found: its verdict, the steps it took and the evidence around them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from drill.replay.compare import Divergence, Tolerance
from drill.runlog.steplog import StepRecord

PASSED, DIVERGED, NOT_REPLAYABLE, ERROR, REFUSED = "passed", "diverged", "not replayable", "error", "refused"
NOT_RUN = "not run"
"""The replay was switched off (``--no-replay``, a policy's ``replay.enabled: false``): a gap the drill chose."""


@dataclass(slots=True, kw_only=True)
class ReplayOutcome:
    verdict: str
    reason: str
    steps: list[tuple[StepRecord | None, StepRecord]] = field(default_factory=list)
    """(reference, replayed) per replayed step: the run's view (its global loss)."""
    rank_steps: dict[int, list[StepRecord]] = field(default_factory=dict)
    """What each rank of a replay by several ranks saw, step by step (its own slice, its local loss)."""
    ranks: int = 1
    """Processes that replayed (the replay's world size)."""
    saved_ranks: int = 1
    """Ranks that saved the checkpoint: a replay by another number is resharded."""
    keys_missing: list[str] = field(default_factory=list)
    """Keys the replay's objects asked for that the checkpoint does not hold (any rank)."""
    keys_untaken: list[str] = field(default_factory=list)
    """Keys the checkpoint holds that no rank's objects took: state a resume would drop."""
    keys_told: bool = False
    """The replay's objects said which keys they take (a DCP load; a target's own ``restore`` does not)."""
    interrupted: bool = False
    """Ended because another rank's replay did (that one is the cause, not this)."""
    divergence: Divergence | None = None
    tolerance: Tolerance | None = None
    reference_source: str | None = None
    first_step_at: float | None = None
    """perf_counter when the first replayed step finished (for time-to-first-step)."""
    restore_seconds: float | None = None
    seconds: float = 0.0
    traceback: str | None = None
    entrypoint: str | None = None
    """The ``module:function`` that built the training objects (None: none was found)."""
    entrypoint_source: str | None = None
    """Who named it: ``--replay`` (or a policy's ``replay.entrypoint``), or the run's ``run.json``."""
    hint: str | None = None
    """What would make it replayable, when something would."""
    environment: dict[str, Any] | None = None
    """Where it ran: ``current`` (drill's own environment: interpreter, package versions), and
    for a candidate environment ``candidate`` and ``changed`` (package → [current, candidate])."""

    @property
    def resharded(self) -> bool:
        return self.ranks != self.saved_ranks
