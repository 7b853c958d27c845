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
        d.follows_replay = True
        return None
    d.outcome.distributed = figures(reports, ctx.shard)
    merged = merge(reports)
    if merged.metadata_error is None:
        ctx.shard = None
        adapter.finish_merged(merged, d.storage, d.inputs.ref, ctx)
    return merged


class DrillPeers:
    """The drill's other ranks as the replay sees them (:class:`~drill.replay.processes.Peers`):
    rank 0 says what to run through the drill's store, each rank runs its own rank of the
    replay, and a rank whose replay ends tells the others at once."""

    def __init__(self, dist: Any) -> None:
        from drill.dist.rendezvous import attempt_prefix, store_address

        self.dist, self.size, self.started = dist, dist.world, False
        self.store, self.prefix = store_address(), f"{attempt_prefix()}replay-group/"

    def start(self, job: dict[str, Any] | None) -> None:
        if not self.started:
            self.started = True
            self.dist.broadcast(job, "replay")

    def failed(self) -> str | None:
        try:
            if int(self.dist.store.add("replay-failed", 0)) > 0:
                return f"stopped: {self.dist.store.get('replay-why').decode(errors='replace')}"
        except Exception:  # noqa: BLE001 - the store is gone: the drill's own watch says so
            return None
        return None

    def fail(self, why: str) -> None:
        if int(self.dist.store.add("replay-failed", 1)) == 1:
            self.dist.store.set("replay-why", why)

    def collect(self, part: dict[str, Any]) -> list[dict[str, Any]]:
        return self.dist.gather(part, "replay-parts") or []


def follow_replay(d: Drill) -> None:
    """A rank other than 0: its own rank of the replay, when rank 0 starts one that spans the
    drill's ranks; what it saw goes to rank 0, which judges and records."""
    from drill.replay.processes import PASSED, Placement, part_of, run_children

    job = d.dist.broadcast(None, "replay")
    if job is None:
        return
    peers = DrillPeers(d.dist)
    d.dist.reached("replay")
    outcome = run_children(
        job["args"], placement=Placement(job["ranks"], True, d.dist.rank, peers.store, peers.prefix),
        timeout=job["timeout"], started=time.perf_counter(), untrusted=tuple(job["untrusted"]), python=job["python"],
        stop=peers.failed,
    )  # fmt: skip
    if outcome.verdict != PASSED and not outcome.interrupted:
        peers.fail(f"rank {d.dist.rank}: {outcome.reason}")
    d.dist.gather(part_of(outcome, secondary=outcome.interrupted), "replay-parts")


def settle(d: Drill, outcome: DrillOutcome) -> DrillOutcome:
    """Rank 0 publishes the verdict; every other rank takes it (and exits with its code). A
    rank that stopped before it sent its share says why first, so rank 0 does not wait for it."""
    from drill.errors import ExitCode
    from drill.verdict import DrillStatus

    dist = d.dist
    if dist.is_root:
        if d.peers is None or not d.peers.started:
            try:
                dist.broadcast(None, "replay")  # the others wait to hear whether a replay spans them
            except Exception:  # noqa: BLE001 - the store is gone: the verdict's publishing says so
                pass
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
