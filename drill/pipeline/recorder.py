"""The recorder a drill reports to, and the null one for benchmarks and unit tests.

The pipeline calls these in order: ``begin`` (the row exists from here on, as a visible
trace), ``phase`` as it moves on, ``selected`` once it knows the checkpoint, ``checks`` after
each stage, and ``finish`` once, whatever happened. ``finish`` never raises: an
implementation must close the record it began or leave the verdict where its next start
will find it (see :class:`drill.records.recorder.DatabaseRecorder`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from drill.findings import CheckResult

if TYPE_CHECKING:
    from drill.integrity.coverage import CoverageUpdate
    from drill.pipeline.outcome import CheckpointInfo, DrillOutcome


@dataclass(frozen=True, slots=True, kw_only=True)
class DrillStart:
    run_root: str
    selector: str
    trigger: str
    device: str
    policy: str | None
    started_at: datetime
    versions: Mapping[str, str | None]
    job_id: str | None = None
    """The batch job running the drill (``slurm:1234``), if any."""


class Recorder(Protocol):
    def begin(self, start: DrillStart) -> int | None:
        """Record that a drill started; returns its id (None: nothing is recorded)."""
        ...

    def phase(self, name: str) -> None:
        """The drill reached ``name`` (a crash leaves the last one on the record)."""
        ...

    def selected(
        self, checkpoint: CheckpointInfo, *, selection: str, evidence_level: str | None, sample: str | None
    ) -> None:
        """The checkpoint this drill restores, how it was chosen, and what evidence it rests on."""
        ...

    def last_drilled(self, run_root: str) -> Mapping[str, datetime]:
        """Checkpoint URI → when it was last drilled, for coverage-aware selection."""
        ...

    def last_verified(self, checkpoint_uri: str) -> Mapping[str, datetime]:
        """File path → when its bytes last matched their seal (the coverage ledger)."""
        ...

    def verified(self, checkpoint: CheckpointInfo, update: CoverageUpdate, days: float) -> float | None:
        """Record what a seal just proved (and what it no longer vouches for) in the coverage
        ledger; the share of the checkpoint's bytes verified within ``days`` (None when not known)."""
        ...

    def checks(self, results: list[CheckResult]) -> None:
        """Check results as they are produced."""
        ...

    def finish(self, outcome: DrillOutcome) -> None:
        """Close the drill with its verdict. Never raises."""
        ...


class NullRecorder:
    """Records nothing: a drill run purely in memory."""

    def begin(self, start: DrillStart) -> int | None:
        return None

    def phase(self, name: str) -> None:
        pass

    def selected(
        self, checkpoint: CheckpointInfo, *, selection: str, evidence_level: str | None, sample: str | None
    ) -> None:
        pass

    def last_drilled(self, run_root: str) -> Mapping[str, datetime]:
        return {}

    def last_verified(self, checkpoint_uri: str) -> Mapping[str, datetime]:
        return {}

    def verified(self, checkpoint: CheckpointInfo, update: CoverageUpdate, days: float) -> float | None:
        return None

    def checks(self, results: list[CheckResult]) -> None:
        pass

    def finish(self, outcome: DrillOutcome) -> None:
        pass
