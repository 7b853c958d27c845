"""One drill, top to bottom.

::

    discover → select → plan integrity → restore (read + hash + load) → checks → replay → verdict

:func:`run_drill` is the whole path; each stage is a small function in
:mod:`drill.pipeline.stages` that returns the checks it ran. What the drill found is a
:class:`~drill.pipeline.outcome.DrillOutcome`; where it is recorded is the
:class:`~drill.pipeline.recorder.Recorder`'s business.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drill.lazy import lazy_names

if TYPE_CHECKING:
    from drill.dist.context import DistContext
    from drill.pipeline.outcome import DrillOutcome
    from drill.pipeline.recorder import NullRecorder, Recorder
    from drill.pipeline.request import DrillRequest
    from drill.restore import Progress
    from drill.storage import Storage


def run_drill(
    request: DrillRequest,
    recorder: Recorder | None = None,
    *,
    progress: Progress | None = None,
    storage: Storage | None = None,
    dist: DistContext | None = None,
) -> DrillOutcome:
    """Run one drill and report it to ``recorder``; returns the outcome.

    A bad checkpoint is a verdict, never an exception. Before anything is recorded it raises
    :class:`~drill.errors.UsageError` for a request this host cannot run (no such device, an
    unknown storage scheme, a replay entrypoint that does not exist),
    :class:`~drill.errors.NothingToDrill` when the run root is not there or the selector names
    no retained checkpoint, and :class:`~drill.errors.StorageProblem` when the storage refuses
    or fails (credentials, an endpoint away) — none of these is an audit record. An interrupt (SIGINT, SIGTERM)
    ends the drill as ``aborted``; drill's own failures end it as ``error``. Either way the
    recorder is told exactly once how the drill ended.

    With ``dist`` (:func:`drill.dist.context.connect`) this process is one rank of a
    distributed drill: every rank restores its share of the files; rank 0 — whose recorder
    alone should write — checks, records and publishes the verdict, which every rank returns.
    """
    from drill.pipeline.recorder import NullRecorder
    from drill.pipeline.stages import Drill, check_stage, discover_stage, plan_stage, replay_stage, restore_stage
    from drill.restore import NullProgress

    drill = Drill.prepare(
        request, recorder or NullRecorder(), progress or NullProgress(), storage, dist
    )  # preflight: nothing recorded yet
    with drill.guarded():
        drill.begin()
        drill.stage("discover", discover_stage, announce=False)  # discover, resume (listed by the preflight)
        drill.stage("plan", plan_stage)  # what to hash; refuses paths out of the checkpoint
        drill.stage("restore", restore_stage)  # read + hash + load onto the device
        drill.stage("checks", check_stage)  # integrity, files, load, keys, contract
        drill.stage("replay", replay_stage, announce=request.replay.enabled)  # replay
        if drill.follows_replay:
            from drill.pipeline.ranks import follow_replay

            follow_replay(drill)  # its own rank of a replay that spans the drill's ranks
    outcome = drill.finish()
    if dist is not None:
        from drill.pipeline.ranks import settle

        outcome = settle(drill, outcome)
    return outcome


_NAMES = {
    "DrillOutcome": "drill.pipeline.outcome",
    "DrillRequest": "drill.pipeline.request",
    "NullRecorder": "drill.pipeline.recorder",
    "Recorder": "drill.pipeline.recorder",
}


__getattr__ = lazy_names(__name__, _NAMES)
"""What reads recorded outcomes (:mod:`drill.pipeline.outcome`) does not load a drill's request,
its recorder and the replay with them (a fifth of ``drill metrics``' imports after SQLAlchemy)."""


__all__ = ["DrillOutcome", "DrillRequest", "NullRecorder", "Recorder", "run_drill"]
