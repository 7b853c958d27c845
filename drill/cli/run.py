"""``drill run``: one drill by hand, or the drill a policy describes."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from drill.formats import FORMATS

from drill.cli.common import (
    AllowClassOption,
    CoverageDaysOption,
    DbOption,
    DebugOption,
    JsonOption,
    KeyFileOption,
    QuietOption,
    RequireSealedOption,
    SampleOption,
    exit_with,
    print_json,
    stderr,
    stdout,
)
from drill.errors import DrillError, ExitCode, UsageError
from drill.verdict import DrillStatus

if TYPE_CHECKING:
    from drill.pipeline import DrillOutcome, DrillRequest

Root = Annotated[str | None, typer.Option("--root", help="Run directory holding the checkpoints (step-N/, checkpoint-N/, *.pt).")]
Checkpoint = Annotated[str, typer.Option("--checkpoint", "-c", help="Which checkpoint: latest, oldest, step:N or a checkpoint path.")]
PolicyFile = Annotated[
    Path | None, typer.Option("--policy", help="Run the drill a policy file describes, isolated in a child process (quiet unless it fails).")
]
Device = Annotated[str, typer.Option("--device", help="Restore onto auto (CUDA if present), cpu, cuda or cuda:N.")]
Format = Annotated[str, typer.Option("--format", help=f"Force a format: {', '.join(FORMATS)}.")]
AllowMissing = Annotated[list[str] | None, typer.Option("--allow-missing", help="Accept a missing part (repeatable, or comma-separated), e.g. rng or rng,dataloader.")]
FiniteScan = Annotated[str, typer.Option("--finite-scan", help="NaN/Inf scan of weights and moments: full, sampled or off.")]
Replay = Annotated[str | None, typer.Option("--replay", help="Replay entrypoint module:function (default: the one the run's run.json names).")]
ReplaySteps = Annotated[int, typer.Option("--replay-steps", help="K: training steps to replay and compare.")]
ReplayTimeout = Annotated[float, typer.Option("--replay-timeout", help="Wall-clock limit for the replay, seconds.")]
Rtol = Annotated[float | None, typer.Option("--rtol", help="Relative tolerance for loss/grad norm (default: exact on the same device type).")]
Atol = Annotated[float | None, typer.Option("--atol", help="Absolute tolerance for loss/grad norm.")]
NoReplay = Annotated[bool, typer.Option("--no-replay", help="Skip the replay (the drill then proves restore only).")]
MemoryBudget = Annotated[str | None, typer.Option("--memory-budget", help="Most the restored state may occupy (e.g. 16GiB); default: what the device has free.")]
Timeout = Annotated[float, typer.Option("--timeout", help="Seconds the whole drill may take before it ends as an error (a hung mount).")]
Durable = Annotated[str | None, typer.Option("--durable", help="The run's copy on a durable tier (e.g. s3://bucket/run7): verify the drilled checkpoint's copy there too.")]
RankTimeout = Annotated[
    float, typer.Option("--rank-timeout", help="Under torchrun/srun: seconds a rank may lag behind the others before it counts as dead or hung.")
]
Trigger = Annotated[str, typer.Option("--trigger", hidden=True)]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Say what would be drilled — the checkpoint chosen, its files, the replay — and record nothing.")]


def run(
    root: Root = None,
    checkpoint: Checkpoint = "latest",
    policy: PolicyFile = None,
    device: Device = "auto",
    format: Format = "auto",
    allow_missing: AllowMissing = None,
    allow_class: AllowClassOption = None,
    finite_scan: FiniteScan = "full",
    sample: SampleOption = "all",
    require_sealed: RequireSealedOption = False,
    key_file: KeyFileOption = None,
    coverage_days: CoverageDaysOption = 7.0,
    replay: Replay = None,
    replay_steps: ReplaySteps = 5,
    replay_timeout: ReplayTimeout = 300.0,
    rtol: Rtol = None,
    atol: Atol = None,
    no_replay: NoReplay = False,
    timeout: Timeout = 3600.0,
    memory_budget: MemoryBudget = None,
    durable: Durable = None,
    rank_timeout: RankTimeout = 600.0,
    trigger: Trigger = "manual",
    dry_run: DryRun = False,
    db: DbOption = None,
    json: JsonOption = False,
    quiet: QuietOption = False,
    debug: DebugOption = False,
) -> None:
    """Restore one checkpoint onto a device, verify and check it, replay it, and record the drill.

    Every file is read once and every tensor is loaded onto the device; the bytes are hashed
    in the same pass and compared with the checkpoint's manifest; the state is checked for a
    resume; then K training steps are replayed from it in a child process and compared with
    what the original run did. The verdict, every check's evidence, the restore latency per
    phase and the time to first step are recorded in the database.

    Under torchrun or srun every rank runs this same command: each restores its share of the
    files, and rank 0 checks, records and prints the drill.

    Example: drill run --root ./demo-run --checkpoint latest
    """
    from drill.dist.context import launched_world

    ranks = launched_world() is not None
    if dry_run:
        request = policy_request(_only_policy(policy, root, checkpoint), "policy") if policy else build_request(locals())
        return show_plan(request, db=db, json=json)
    if policy is not None and not ranks:
        return run_policy(_only_policy(policy, root, checkpoint), db=db, json=json, trigger="policy" if trigger == "manual" else trigger)
    request = policy_request(_only_policy(policy, root, checkpoint), "policy" if trigger == "manual" else trigger) if policy else build_request(locals())
    if ranks:
        return run_ranks(request, db=db, json=json, quiet=quiet, rank_timeout=rank_timeout)
    run_one(request, db=db, json=json, quiet=quiet)


def show_plan(request: DrillRequest, *, db: str | None, json: bool) -> None:
    """``--dry-run``: what would be drilled, on stdout; nothing read beyond listings, nothing recorded."""
    from drill.api import dry_run
    from drill.units import human_bytes

    plan = dry_run(request, db=db)
    if json:
        return print_json(plan)
    out = stdout()
    ck = plan["checkpoint"]
    if ck is None:
        out.print(f"would drill {plan['run_root']}: no complete checkpoint — {plan.get('would_fail', 'nothing retained')} (recorded as failed, exit 3)", markup=False)
        return None
    sealed = "sealed" if ck["sealed"] else "unsealed"
    out.print(f"would drill {ck['uri']} (step {ck['step']}, {ck['format']}, {ck['files']} files, {human_bytes(ck['bytes'])}, {sealed})", markup=False)
    out.print(f"  chosen: {plan['selection']}; retained: {', '.join(plan['retained'])}", markup=False)
    replay = plan["replay"]
    out.print("  replay: not run" if replay is None else f"  replay: {replay['steps']} steps through {replay['entrypoint'] or 'no entrypoint (not replayable)'}" + (f" (named by {replay['named_by']})" if replay["named_by"] else ""), markup=False)
    out.print(f"  options: {' '.join(plan['flags']) or '(defaults)'}; recorded in {plan['database']}", markup=False)
    return None


def run_one(request: DrillRequest, *, db: str | None, json: bool, quiet: bool) -> None:
    """One drill in this process, recorded and reported."""
    from drill.api import run_drill
    from drill.cli.progress import RichProgress
    from drill.proc import process_claimed
    from drill.records.db import resolve_url, safe_url
    from drill.replay.zygote import prepare

    where = safe_url(resolve_url(db))
    if request.replay.enabled and process_claimed():
        prepare()  # the `drill` command: torch is imported and nothing has run yet, so the replay's child is forked now
    with RichProgress(quiet=quiet) as progress:
        outcome = run_drill(request, db=db, progress=progress)
    report(outcome, json=json, where=where)


def _only_policy(policy: Path, root: str | None, checkpoint: str) -> Path:
    if (root, checkpoint) != (None, "latest"):
        raise UsageError("--policy names the run and how to select its checkpoint; drop --root/--checkpoint")
    return policy


def policy_request(path: Path, trigger: str) -> DrillRequest:
    """A policy's drill as a request, for a rank of a distributed job (the batch system, not a
    child process, bounds its time and memory)."""
    from drill.cli.nightly import load_policy_or_fail
    from drill.policy.request import request_from_policy

    return request_from_policy(load_policy_or_fail(path), trigger)


def run_ranks(request: DrillRequest, *, db: str | None, json: bool, quiet: bool, rank_timeout: float) -> None:
    """One rank of a distributed drill: rank 0 records and reports, the others only restore."""
    from drill.api import run_drill
    from drill.cli.progress import RichProgress
    from drill.dist.context import connect
    from drill.pipeline import NullRecorder
    from drill.records.db import resolve_url, safe_url

    if rank_timeout <= 0:
        raise UsageError(f"--rank-timeout must be positive, not {rank_timeout:g}")
    dist = connect(rank_timeout)
    request = _local_device(request)
    try:
        if dist is None or dist.is_root:
            with RichProgress(quiet=quiet) as progress:
                outcome = run_drill(request, db=db, progress=progress, dist=dist)
            return report(outcome, json=json, where=safe_url(resolve_url(db)))
        outcome = run_drill(request, recorder=NullRecorder(), dist=dist)
    finally:
        if dist is not None:
            dist.close()
    if outcome.status is not DrillStatus.PASSED and outcome.message:
        stderr().print(f"drill: rank {dist.rank}: {outcome.status.value}: {outcome.message}", markup=False)
    raise exit_with(outcome.exit_code)


def _local_device(request: DrillRequest) -> DrillRequest:
    """On a GPU node each rank restores onto its own device: ``cuda:$LOCAL_RANK``."""
    import dataclasses

    local = os.environ.get("LOCAL_RANK") or os.environ.get("SLURM_LOCALID")
    if request.device not in ("auto", "cuda") or local is None or not local.isdigit():
        return request
    import torch

    return dataclasses.replace(request, device=f"cuda:{local}") if torch.cuda.is_available() else request


def build_request(opts: dict) -> DrillRequest:  # type: ignore[type-arg]
    """The request the flags describe; every flag is checked here, before any I/O."""
    from drill.checks import Expectations
    from drill.pipeline import DrillRequest
    from drill.replay import ReplaySpec, Tolerance

    try:
        tolerance = None if opts["rtol"] is None and opts["atol"] is None else Tolerance(opts["rtol"] or 0.0, opts["atol"] or 0.0)
        expectations = Expectations(allow_missing=split_list(opts["allow_missing"]), finite_scan=opts["finite_scan"])
        replay = ReplaySpec(
            entrypoint=opts["replay"], steps=opts["replay_steps"], timeout=opts["replay_timeout"], tolerance=tolerance, enabled=not opts["no_replay"]
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return DrillRequest(
        selector=opts["checkpoint"],
        root=opts["root"],
        device=opts["device"],
        trigger=opts["trigger"],
        sample=opts["sample"],
        require_sealed=opts["require_sealed"],
        key_file=opts["key_file"],
        coverage_days=opts["coverage_days"],
        format=opts["format"],
        allow_classes=split_list(opts["allow_class"]),
        expectations=expectations,
        replay=replay,
        timeout=opts["timeout"],
        memory_budget=opts["memory_budget"],
        durable=opts["durable"],
    )


def split_list(values: list[str] | None) -> tuple[str, ...]:
    """A repeatable option's values, each of which may also be a comma-separated list."""
    return tuple(v.strip() for value in values or () for v in value.split(",") if v.strip())


def report(outcome: DrillOutcome, *, json: bool, where: str | None = None) -> None:
    """The outcome on stdout; one line on stderr when it did not pass; the drill's exit code."""
    from drill.cli.render import render_outcome

    if json:
        print_json(outcome.to_document())
    else:
        render_outcome(stdout(), outcome, where)
    err = stderr()
    if outcome.status is not DrillStatus.PASSED and outcome.message:
        recorded = f" (drill #{outcome.id} recorded as {outcome.status.value})" if outcome.id is not None else " (nothing was recorded)"
        tail = recorded if outcome.status is DrillStatus.ABORTED else ""
        err.print(f"drill: {outcome.status.value}: {outcome.message}{tail}", markup=False)
    if outcome.record_problem:
        err.print(f"drill: warning: {outcome.record_problem}", markup=False)
    if outcome.status is DrillStatus.ABORTED and sys.stdout is sys.__stdout__:
        # Interrupted: the record is written; reads still in flight (a hung mount) must not
        # hold the process, and interpreter shutdown would wait for them.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(outcome.exit_code))
    raise exit_with(outcome.exit_code)


def run_policy(path: Path, *, db: str | None, json: bool, trigger: str) -> None:
    """``drill run --policy``: the drill runs isolated in a child; quiet when it passes."""
    from drill.api import run_policy as run_isolated_policy
    from drill.cli.nightly import load_policy_or_fail

    result = run_isolated_policy(load_policy_or_fail(path), db=db, trigger=trigger)
    if result.status is None:  # refused before a record was opened: the child's own error and exit code
        refused = DrillError(f"policy {path}: {result.message}")
        refused.exit_code = ExitCode(result.exit_code)
        raise refused
    if json:
        print_json(result.document)
    if result.status is not DrillStatus.PASSED:
        stderr().print(f"drill: {result.status.value}: drill #{result.drill_id}: {result.message}", markup=False)
    if result.record_problem:
        stderr().print(f"drill: warning: {result.record_problem}", markup=False)
    raise exit_with(result.exit_code)
