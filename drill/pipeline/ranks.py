"""The pipeline's stages when many ranks run one drill (see :mod:`drill.dist`).

Rank 0 leads: it discovers, selects and plans, and every other rank follows its choice; all
ranks restore their share; rank 0 merges the reports, runs the checks and the replay, records
the drill and publishes the verdict, which every rank exits with.
"""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING, Any

from drill.findings import CheckResult

if TYPE_CHECKING:
    from drill.formats.base import RestoreContext
    from drill.pipeline.outcome import DrillOutcome
    from drill.pipeline.stages import Drill
    from drill.restore import RestoreResult


def lead_discovery(d: Drill) -> None:
    """Rank 0: every rank drills the checkpoint rank 0 chose (a random choice included), and
    knows the record rank 0 keeps."""
    d.dist.broadcast((d.inputs.ref, d.inputs.selection, d.stopped, d.outcome.id), "discover")


def follow_discovery(d: Drill) -> list[CheckResult]:
    ref, selection, stopped, drill_id = d.dist.broadcast(None, "discover")
    d.inputs.ref, d.inputs.selection = ref, selection
    d.outcome.id = drill_id  # rank 0's record: rank 1 closes it should rank 0 be lost
    if stopped:
        d.stop(stopped)
    return []


def share_plan(d: Drill) -> None:
    """What to hash, as rank 0 planned it (its coverage ledger decides a sampled drill's files)."""
    plan = d.inputs.plan
    d.dist.broadcast((plan.hash_plan if plan is not None else None, d.stopped), "plan")


def follow_plan(d: Drill) -> list[CheckResult]:
    d.hash_plan, stopped = d.dist.broadcast(None, "plan")
    if stopped:
        d.stop(stopped)
    return []


def restore_across_ranks(d: Drill, adapter: Any, ctx: RestoreContext) -> RestoreResult | None:
    """This rank's share; on rank 0 the merged result, with the per-rank figures on the outcome."""
    from drill.dist.restore import figures, merge, restore_share

    reports = restore_share(d.dist, adapter, d.storage, d.inputs.ref, ctx, d.request.expectations.finite_scan)
    if reports is None:
        d.stop(f"rank {d.dist.rank} restored its share; rank 0 checks and records the drill")
        return None
    d.outcome.distributed = figures(reports, ctx.shard)
    merged = merge(reports)
    if merged.metadata_error is None:
        ctx.shard = None
        adapter.finish_merged(merged, d.storage, d.inputs.ref, ctx)
    return merged


def settle(d: Drill, outcome: DrillOutcome) -> DrillOutcome:
    """Rank 0 publishes the verdict; every other rank takes it (and exits with its code). A
    rank that stopped before it sent its share says why first, so rank 0 does not wait for it."""
    from drill.errors import ExitCode
    from drill.verdict import DrillStatus

    dist = d.dist
    if dist.is_root:
        dist.publish("verdict", (outcome.id, outcome.status.value, int(outcome.exit_code), outcome.message))
        return outcome
    if outcome.status in (DrillStatus.ERROR, DrillStatus.ABORTED) and not dist.reported:
        dist.fail(outcome.message or outcome.status.value, signalled=d.guard.signum is not None)
    try:
        outcome.id, status, code, outcome.message = _take_verdict(d)
        outcome.status, outcome.exit_code = DrillStatus(status), ExitCode(code)
    except Exception as exc:  # noqa: BLE001 - rank 0 is gone: this rank cannot know the verdict
        outcome.status, outcome.exit_code, outcome.message = DrillStatus.ERROR, ExitCode.ERROR, str(exc)
    return outcome


def _take_verdict(d: Drill) -> Any:
    """Rank 0's verdict. A signal — before or while this rank waits — is what a launcher sends
    every rank when one dies: if rank 0 died, :class:`~drill.dist.failure.RankFailure` naming it
    (and this rank closes its record); if it lives, it records how the drill ended: wait for that."""
    from drill.dist.failure import RankFailure
    from drill.interrupts import Interrupted, InterruptGuard

    dist = d.dist
    dist.reached("verdict")
    timeout = d.request.timeout if d.request.timeout is not None else float("inf")
    left = max(1.0, timeout - (time.perf_counter() - d.started))
    with InterruptGuard() as guard:
        try:
            if d.guard.signum is None:
                return dist.wait_for("verdict", left)
        except Interrupted:
            guard.quiet()  # from now on a signal only counts; a third one exits
        signum = d.guard.signum or guard.signum or signal.SIGTERM
        dist.fail(f"interrupted by {signal.Signals(signum).name}", signalled=True)
        dead = dist.casualties([0])
        if dead:
            dist.root_lost = dead[0][1]
            raise RankFailure(dead[0][1], [0])
        return dist.wait_for("verdict", min(left, 60.0))


__all__ = ["follow_discovery", "follow_plan", "lead_discovery", "restore_across_ranks", "settle", "share_plan"]
