"""``drill run`` as one rank of a distributed drill (under torchrun, srun or an indexed Job).

Rank 0 records and reports; the others restore their share and exit with rank 0's verdict.
Whatever stops a rank early — a refusal, an interrupt, an exception — is published to the
others before it leaves, so no rank waits out the rank timeout for it. When rank 0 itself is
lost, rank 1 closes rank 0's record as an ``error`` naming it, and leaves the verdict file.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

from drill.cli.common import exit_with, stderr
from drill.cli.ending import leave_verdict, report
from drill.dist.failure import RankFailure
from drill.errors import DrillError, ExitCode, UsageError
from drill.failpoints import failpoint
from drill.interrupts import Interrupted, held_off
from drill.verdict import DrillStatus

if TYPE_CHECKING:
    from drill.dist.context import DistContext
    from drill.pipeline import DrillOutcome, DrillRequest


def run_ranks(
    request: DrillRequest,
    *,
    db: str | None,
    json: bool,
    quiet: bool,
    rank_timeout: float,
    lost_after: float,
    verdict_file: str | None,
) -> None:
    """One rank of a distributed drill: rank 0 records and reports, the others only restore."""
    from drill.dist.context import casualties_before_joining, connect
    from drill.records.db import resolve_url, safe_url

    for name, value in (("--rank-timeout", rank_timeout), ("--lost-after", lost_after)):
        if value <= 0:
            raise UsageError(f"{name} must be positive, not {value:g}")
    try:
        failpoint("joining")
        dist = connect(rank_timeout, lost_after=lost_after)
    except (KeyboardInterrupt, Interrupted) as exc:  # a loaded rank may hear of a peer's death before it joined
        with held_off():
            _name_the_dead(casualties_before_joining(rank_timeout, lost_after), exc)
        raise
    request = local_device(request)
    try:
        outcome = _drill(request, dist, db=db, quiet=quiet)
    except BaseException as exc:  # refused before the drill began, or stopped: the others must not wait
        if dist is not None:
            _tell_the_others(dist, exc)
            if isinstance(exc, (KeyboardInterrupt, Interrupted)):
                _name_the_dead(dist.casualties(), exc)
        raise
    finally:
        if dist is not None:
            dist.close()
    if dist is None or dist.is_root:
        leave_verdict(verdict_file, outcome.id, outcome.status.value, int(outcome.exit_code), outcome.message, rank=0)
        return report(outcome, json=json, where=safe_url(resolve_url(db)))
    if dist.root_lost is not None and dist.rank == 1:
        _close_for_lost_root(outcome, db)
        leave_verdict(verdict_file, outcome.id, outcome.status.value, int(outcome.exit_code), outcome.message, rank=1)
    if outcome.status is not DrillStatus.PASSED and outcome.message:
        stderr().print(f"drill: rank {dist.rank}: {outcome.status.value}: {outcome.message}", markup=False)
    raise exit_with(outcome.exit_code)


def _drill(request: DrillRequest, dist: DistContext | None, *, db: str | None, quiet: bool) -> DrillOutcome:
    from drill.api import run_drill
    from drill.cli.progress import RichProgress
    from drill.pipeline import NullRecorder

    if dist is None or dist.is_root:
        with RichProgress(quiet=quiet) as progress:
            return run_drill(request, db=db, progress=progress, dist=dist)
    return run_drill(request, recorder=NullRecorder(), dist=dist)


def _tell_the_others(dist: DistContext, exc: BaseException) -> None:
    """Publish why this rank stops; rank 0 also publishes the exit code every rank takes."""
    signalled = isinstance(exc, (KeyboardInterrupt, Interrupted))
    if isinstance(exc, DrillError):
        cause, code = exc.message, int(exc.exit_code)
    elif signalled:
        cause, code = str(exc) or "interrupted by SIGINT", int(ExitCode.INTERRUPTED)
    else:
        cause, code = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}", int(ExitCode.ERROR)
    dist.fail(cause, signalled=signalled)
    if dist.is_root:
        status = DrillStatus.FAILED if code == ExitCode.NOTHING_TO_DRILL else DrillStatus.ERROR
        dist.publish("verdict", (None, status.value, code, cause))


def _name_the_dead(dead: list[tuple[int, str]], exc: BaseException) -> None:
    """A signal before the drill began: when a peer died, that is what stopped this rank (its
    launcher ends the job when one rank dies) — :class:`RankFailure` naming it."""
    if dead:
        shown = "; ".join(why for _, why in dead[:20])
        raise RankFailure(
            f"{shown}; its launcher then stopped this rank before the drill began (nothing was recorded)",
            [r for r, _ in dead],
        ) from None


def _close_for_lost_root(outcome: DrillOutcome, db: str | None) -> None:
    """Rank 0 is gone with its record open: close it as an ``error`` naming it (once: a record
    rank 0 closed itself is left as it is)."""
    from drill.records.db import open_database
    from drill.records.store import Records

    if outcome.id is None:
        outcome.message = f"{outcome.message} (rank 0 had recorded nothing this rank knows of)"
        return
    try:
        database = open_database(db)
        try:
            Records(database).close_dead_drill(
                outcome.id,
                status=DrillStatus.ERROR,
                exit_code=int(ExitCode.ERROR),
                reason=outcome.message or "rank 0 was lost",
            )
        finally:
            database.close()
    except DrillError as exc:
        stderr().print(
            f"drill: warning: rank 0's drill #{outcome.id} could not be closed ({exc.message})", markup=False
        )


def local_device(request: DrillRequest) -> DrillRequest:
    """On a GPU node each rank restores onto its own device: ``cuda:$LOCAL_RANK``."""
    local = os.environ.get("LOCAL_RANK") or os.environ.get("SLURM_LOCALID")
    if request.device not in ("auto", "cuda") or local is None or not local.isdigit():
        return request
    import torch

    return dataclasses.replace(request, device=f"cuda:{local}") if torch.cuda.is_available() else request


__all__ = ["local_device", "run_ranks"]
