"""``drill run``: one drill by hand, or the drill a policy describes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from drill.cli.common import (
    ROOT_HELP,
    AllowClassOption,
    CheckpointOption,
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
from drill.cli.ending import leave_verdict, report
from drill.errors import DrillError, ExitCode, UsageError
from drill.formats import FORMATS
from drill.verdict import DrillStatus

if TYPE_CHECKING:
    from drill.pipeline import DrillRequest

Root = Annotated[str | None, typer.Option("--root", help=ROOT_HELP)]
PolicyFile = Annotated[
    Path | None,
    typer.Option(
        "--policy", help="Run the drill a policy file describes, isolated in a child process (quiet unless it fails)."
    ),
]
Device = Annotated[str, typer.Option("--device", help="Restore onto auto (CUDA if present), cpu, cuda or cuda:N.")]
Format = Annotated[str, typer.Option("--format", help=f"Force a format: {', '.join(FORMATS)}.")]
AllowMissing = Annotated[
    list[str] | None,
    typer.Option(
        "--allow-missing", help="Accept a missing part (repeatable, or comma-separated), e.g. rng or rng,dataloader."
    ),
]
FiniteScan = Annotated[
    str, typer.Option("--finite-scan", help="NaN/Inf scan of weights and moments: full, sampled or off.")
]
Replay = Annotated[
    str | None,
    typer.Option(
        "--replay",
        help="Replay entrypoint module:function or path/to/file.py:function (default: the one the run's run.json names).",
    ),
]
ReplaySteps = Annotated[int, typer.Option("--replay-steps", help="K: training steps to replay and compare.")]
ReplayTimeout = Annotated[float, typer.Option("--replay-timeout", help="Wall-clock limit for the replay, seconds.")]
CandidatePython = Annotated[
    str | None,
    typer.Option(
        "--python",
        help="Replay under this interpreter: a candidate environment (a newer torch or trainer) that has drill installed; the record says what changed.",
    ),
]
ReplayRanks = Annotated[
    int | None,
    typer.Option(
        "--replay-ranks",
        help="Processes that replay (default: as many as saved the checkpoint; another number reshards, compared with the run's global loss).",
    ),
]
Rtol = Annotated[
    float | None,
    typer.Option("--rtol", help="Relative tolerance for loss/grad norm (default: exact on the same device type)."),
]
Atol = Annotated[float | None, typer.Option("--atol", help="Absolute tolerance for loss/grad norm.")]
NoReplay = Annotated[bool, typer.Option("--no-replay", help="Skip the replay (the drill then proves restore only).")]
MemoryBudget = Annotated[
    str | None,
    typer.Option(
        "--memory-budget", help="Most the restored state may occupy (e.g. 16GiB); default: what the device has free."
    ),
]
Timeout = Annotated[
    float, typer.Option("--timeout", help="Seconds the whole drill may take before it ends as an error (a hung mount).")
]
Cold = Annotated[
    bool,
    typer.Option(
        "--cold",
        help="Drop the checkpoint's pages from the page cache first: a cold restore from the storage, as a restart's.",
    ),
]
Durable = Annotated[
    str | None,
    typer.Option(
        "--durable",
        help="The run's copy on a durable tier (e.g. s3://bucket/run7): verify the drilled checkpoint's copy there too.",
    ),
]
RankTimeout = Annotated[
    float,
    typer.Option(
        "--rank-timeout",
        help="Under torchrun/srun: seconds a rank may lag behind the others before it counts as dead or hung.",
    ),
]
LostAfter = Annotated[
    float,
    typer.Option(
        "--lost-after",
        help="Under torchrun/srun: seconds without a heartbeat before a rank counts as lost (killed, crashed, node gone).",
    ),
]
VerdictFileOption = Annotated[
    str | None,
    typer.Option(
        "--verdict-file",
        envvar="DRILL_VERDICT_FILE",
        help="Also write the verdict (id, status, exit code) here as JSON, for a launcher: `drill verdict FILE` exits with its code.",
    ),
]
Trigger = Annotated[str, typer.Option("--trigger", hidden=True)]
DryRun = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Say what would be drilled — the checkpoint chosen, its files, the replay — and record nothing.",
    ),
]


def run(
    root: Root = None,
    checkpoint: CheckpointOption = "latest",
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
    replay_ranks: ReplayRanks = None,
    python: CandidatePython = None,
    rtol: Rtol = None,
    atol: Atol = None,
    no_replay: NoReplay = False,
    timeout: Timeout = 3600.0,
    memory_budget: MemoryBudget = None,
    durable: Durable = None,
    cold: Cold = False,
    rank_timeout: RankTimeout = 600.0,
    lost_after: LostAfter = 15.0,
    verdict_file: VerdictFileOption = None,
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
    files, and rank 0 checks, records and prints the drill; a rank that dies, hangs or never
    joins ends it as an error naming it. torchrun exits 1 for every failure: use --verdict-file.

    Example: drill run --root ./demo-run --checkpoint latest
    """
    from drill.dist.context import launched_world

    ranks, as_trigger = launched_world() is not None, "policy" if trigger == "manual" or dry_run else trigger
    if policy is not None:
        _only_policy(policy, locals())
    if policy is not None and not ranks and not dry_run:
        return run_policy(policy, db=db, json=json, trigger=as_trigger, verdict_file=verdict_file)
    request = policy_request(policy, as_trigger) if policy else build_request(locals())
    if dry_run:
        return show_plan(request, db=db, json=json)
    if ranks:
        from drill.cli.ranks import run_ranks

        return run_ranks(
            request,
            db=db,
            json=json,
            quiet=quiet,
            rank_timeout=rank_timeout,
            lost_after=lost_after,
            verdict_file=verdict_file,
        )
    run_one(request, db=db, json=json, quiet=quiet, verdict_file=verdict_file)


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
        out.print(
            f"would drill {plan['run_root']}: no complete checkpoint — {plan.get('would_fail', 'nothing retained')} (recorded as failed, exit 3)",
            markup=False,
        )
        return None
    sealed = "sealed" if ck["sealed"] else "unsealed"
    out.print(
        f"would drill {ck['uri']} (step {ck['step']}, {ck['format']}, {ck['files']} files, {human_bytes(ck['bytes'])}, {sealed})",
        markup=False,
    )
    out.print(f"  chosen: {plan['selection']}; retained: {', '.join(plan['retained'])}", markup=False)
    replay = plan["replay"]
    out.print(
        "  replay: not run"
        if replay is None
        else f"  replay: {replay['steps']} steps through {replay['entrypoint'] or 'no entrypoint (not replayable)'}"
        + (f" (named by {replay['named_by']})" if replay["named_by"] else ""),
        markup=False,
    )
    out.print(f"  options: {' '.join(plan['flags']) or '(defaults)'}; recorded in {plan['database']}", markup=False)
    return None


def run_one(request: DrillRequest, *, db: str | None, json: bool, quiet: bool, verdict_file: str | None = None) -> None:
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
    leave_verdict(verdict_file, outcome.id, outcome.status.value, int(outcome.exit_code), outcome.message)
    report(outcome, json=json, where=where)


def verdict(path: Annotated[str, typer.Argument(help="The file drill run --verdict-file wrote.")]) -> None:
    """Exit with the exit code of the drill that wrote a verdict file (for launchers).

    torchrun exits 1 whatever its ranks exited with; after it, this restores drill's own
    code (0 passed, 1 failed, 5 error, 130/143 aborted, …) and says the verdict on stderr. No
    verdict in the file (the drill ended before it decided): exit 5.

    Example: torchrun --nproc-per-node 8 -m drill run --verdict-file v.json ...; drill verdict v.json
    """
    from drill.launch.verdict import read_verdict

    found = read_verdict(path)
    stderr().print(f"drill: {found.line}", markup=False)
    raise exit_with(ExitCode(found.exit_code))


BESIDE_POLICY = frozenset(
    {"policy", "db", "json", "quiet", "debug", "trigger", "verdict_file", "dry_run", "rank_timeout", "lost_after"}
)
"""What ``drill run --policy`` takes beside the policy: where to record and how to report —
everything else (the run, the checkpoint, the device, the checks, the replay, the limits)
is the policy's to say."""


def _only_policy(policy: Path, given: dict[str, object]) -> Path:
    """``policy``, or a usage error naming each option given beside it that the policy owns (it
    would have been ignored: ``--no-replay`` with ``--policy`` replayed anyway)."""
    import inspect

    owned = [
        "--" + name.replace("_", "-")
        for name, param in inspect.signature(run).parameters.items()
        if name not in BESIDE_POLICY and given.get(name, param.default) != param.default
    ]
    if owned:
        raise UsageError(
            f"--policy says how to drill (its run, checkpoint, checks, replay and limits): drop {', '.join(owned)}, or set it in the policy file"
        )
    return policy


def policy_request(path: Path, trigger: str) -> DrillRequest:
    """A policy's drill as a request, for a rank of a distributed job (the batch system, not a
    child process, bounds its time and memory)."""
    from drill.cli.nightly import load_policy_or_fail
    from drill.policy.request import request_from_policy

    return request_from_policy(load_policy_or_fail(path), trigger)


def build_request(opts: dict) -> DrillRequest:
    """The request the flags describe; every flag is checked here, before any I/O."""
    from drill.checks import Expectations
    from drill.pipeline import DrillRequest
    from drill.replay import ReplaySpec, Tolerance
    from drill.replay.spec import anchored

    try:
        tolerance = (
            None
            if opts["rtol"] is None and opts["atol"] is None
            else Tolerance(opts["rtol"] or 0.0, opts["atol"] or 0.0)
        )
        expectations = Expectations(allow_missing=split_list(opts["allow_missing"]), finite_scan=opts["finite_scan"])
        replay = ReplaySpec(
            entrypoint=opts["replay"] and anchored(opts["replay"], os.getcwd()),
            steps=opts["replay_steps"],
            timeout=opts["replay_timeout"],
            ranks=opts["replay_ranks"],
            python=opts["python"] and os.path.abspath(opts["python"]),
            tolerance=tolerance,
            enabled=not opts["no_replay"],
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
        cold=opts["cold"],
    )


def split_list(values: list[str] | None) -> tuple[str, ...]:
    """A repeatable option's values, each of which may also be a comma-separated list."""
    return tuple(v.strip() for value in values or () for v in value.split(",") if v.strip())


def run_policy(path: Path, *, db: str | None, json: bool, trigger: str, verdict_file: str | None = None) -> None:
    """``drill run --policy``: the drill runs isolated in a child; quiet when it passes."""
    from drill.api import run_policy as run_isolated_policy
    from drill.cli.nightly import load_policy_or_fail

    result = run_isolated_policy(load_policy_or_fail(path), db=db, trigger=trigger)
    if result.status is None:  # refused before a record was opened: the child's own error and exit code
        refused = DrillError(f"policy {path}: {result.message}")
        refused.exit_code = ExitCode(result.exit_code)
        raise refused
    leave_verdict(verdict_file, result.drill_id, result.status.value, int(result.exit_code), result.message)
    if json:
        print_json(result.document)
    if result.status is not DrillStatus.PASSED:
        stderr().print(f"drill: {result.status.value}: drill #{result.drill_id}: {result.message}", markup=False)
    if result.record_problem:
        stderr().print(f"drill: warning: {result.record_problem}", markup=False)
    raise exit_with(result.exit_code)
