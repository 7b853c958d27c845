"""``drill``: the command-line skin over the library."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from drill import __version__
from drill.cli.common import (
    CoverageDaysOption,
    DbOption,
    DebugOption,
    JsonOption,
    RequireSealedOption,
    SampleOption,
    error_boundary,
    fail,
    parse_sample_option,
    print_json,
    stderr,
    stdout,
)
from drill.errors import ExitCode

EXIT_CODES = """\
Exit codes: 0 passed · 1 failed (a check found a problem) · 2 usage error ·
3 nothing to drill (root missing, no complete checkpoint, step not retained) ·
4 database unreachable or schema not at head · 5 drill error (recorded as error) ·
6 SLO breach (checks passed, too slow) · 7 another scheduler holds the lease ·
70 internal error (a bug; --debug shows the traceback) · 130 interrupted (recorded as aborted)."""


class OneLineErrors(TyperGroup):
    """Usage errors as one ``drill: error: …`` line on stderr with exit code 2, not a box."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:  # type: ignore[override]
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except typer.Abort:
            rv = int(ExitCode.INTERRUPTED)
        except typer.TyperException as exc:  # click's usage errors, as vendored by typer
            stderr().print(f"drill: error: {exc.format_message()}", markup=False)  # type: ignore[attr-defined]
            rv = getattr(exc, "exit_code", int(ExitCode.USAGE))
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(
    cls=OneLineErrors,
    name="drill",
    help="Restore drills for PyTorch training checkpoints: prove that a run can really resume.",
    epilog=EXIT_CODES,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
db_app = typer.Typer(cls=OneLineErrors, help="Manage the record database's schema.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(db_app, name="db")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"drill {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")] = False,
) -> None:
    pass


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@app.command()
@error_boundary
def run(
    root: Annotated[str | None, typer.Option("--root", help="Run directory holding the checkpoints (step-N/).")] = None,
    checkpoint: Annotated[
        str, typer.Option("--checkpoint", "-c", help="Which checkpoint: latest, oldest, step:N or a checkpoint path.")
    ] = "latest",
    policy: Annotated[
        Path | None,
        typer.Option(
            "--policy",
            help="Run the drill a policy file describes, isolated in a child process (for crontab: quiet unless it fails).",
        ),
    ] = None,
    in_child: Annotated[bool, typer.Option("--in-child", hidden=True)] = False,
    trigger: Annotated[str, typer.Option("--trigger", hidden=True)] = "manual",
    device: Annotated[str, typer.Option("--device", help="Restore onto auto (CUDA if present), cpu, cuda or cuda:N.")] = "auto",
    format: Annotated[
        str, typer.Option("--format", help="Force a format: auto, dcp, torch-save, lightning, hf-trainer.")
    ] = "auto",
    allow_missing: Annotated[
        list[str] | None,
        typer.Option("--allow-missing", help="Accept a missing part (repeatable), e.g. rng for a run without dropout."),
    ] = None,
    allow_class: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-class",
            help="Allow-list a class a layout legitimately pickles (repeatable), e.g. "
            "transformers.training_args.TrainingArguments.",
        ),
    ] = None,
    finite_scan: Annotated[str, typer.Option("--finite-scan", help="NaN/Inf scan of weights and moments: full, sampled or off.")] = "full",
    sample: SampleOption = "all",
    require_sealed: RequireSealedOption = False,
    coverage_days: CoverageDaysOption = 7.0,
    replay: Annotated[
        str | None,
        typer.Option("--replay", help="Replay entrypoint module:function (default: the one the run's run.json names)."),
    ] = None,
    replay_steps: Annotated[int, typer.Option("--replay-steps", help="K: training steps to replay and compare.")] = 5,
    replay_timeout: Annotated[float, typer.Option("--replay-timeout", help="Wall-clock limit for the replay, seconds.")] = 300.0,
    rtol: Annotated[
        float | None, typer.Option("--rtol", help="Relative tolerance for loss/grad norm (default: exact on the same device type).")
    ] = None,
    atol: Annotated[float | None, typer.Option("--atol", help="Absolute tolerance for loss/grad norm.")] = None,
    no_replay: Annotated[bool, typer.Option("--no-replay", help="Skip the replay (the drill then proves restore only).")] = False,
    db: DbOption = None,
    json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Restore one checkpoint onto a device, verify and check it, replay it, and record the drill.

    Every file is read once and every tensor is loaded onto the device; the bytes are hashed
    in the same pass and compared with the checkpoint's manifest; the state is checked for a
    resume; then K training steps are replayed from it in a child process and compared with
    what the original run did. The verdict, every check's evidence, the restore latency per
    phase and the time to first step are recorded in the database.

    Example: drill run --root ./demo-run --checkpoint latest
    """
    from drill.cli.progress import RichProgress
    from drill.cli.render import outcome_document, render_outcome
    from drill.records.db import open_database, safe_url
    from drill.records.store import Records
    from drill.runner import DrillRequest, resolve_device, run_drill
    from drill.select import parse_selector

    from drill.checks import Expectations
    from drill.errors import UsageError
    from drill.formats import check_format

    if policy is not None:
        return _run_policy(policy, db=db, json=json, in_child=in_child, trigger=trigger, explicit=(root, checkpoint))

    from drill.replay import ReplaySpec, Tolerance

    try:
        expectations = Expectations(allow_missing=tuple(allow_missing or ()), finite_scan=finite_scan)
        tolerance = None if rtol is None and atol is None else Tolerance(rtol or 0.0, atol or 0.0)
        replay_spec = ReplaySpec(
            entrypoint=replay, steps=replay_steps, timeout=replay_timeout, tolerance=tolerance, enabled=not no_replay
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    request = DrillRequest(
        selector=parse_selector(checkpoint),
        root=root,
        device=device,
        sample=parse_sample_option(sample),
        require_sealed=require_sealed,
        coverage_days=coverage_days,
        format=check_format(format),
        allow_classes=tuple(allow_class or ()),
        expectations=expectations,
        replay=replay_spec,
    )
    resolve_device(device)  # flags are validated before any I/O
    database = open_database(db)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        with RichProgress(enabled=True) as progress:
            outcome = run_drill(request, Records(database), progress)
    except KeyboardInterrupt:
        raise fail("interrupted: the drill is recorded as aborted", ExitCode.INTERRUPTED) from None
    finally:
        database.close()
    url = safe_url(database.url)
    if json:
        print_json(outcome_document(outcome, url))
    else:
        render_outcome(stdout(), outcome, url)
    if outcome.exit_code != ExitCode.PASSED and outcome.message:
        stderr().print(f"drill: {outcome.status}: {outcome.message}", markup=False)
    raise typer.Exit(int(outcome.exit_code))


def _load_policy(path: Path):  # type: ignore[no-untyped-def]
    from drill.errors import UsageError
    from drill.policy import PolicyError, load_policy

    try:
        return load_policy(path)
    except PolicyError as exc:
        more = f" (and {len(exc.problems) - 1} more: drill policy check {path})" if len(exc.problems) > 1 else ""
        raise UsageError(f"invalid policy: {exc.problems[0]}{more}") from None


def _run_policy(path: Path, *, db: str | None, json: bool, in_child: bool, trigger: str, explicit: tuple) -> None:  # type: ignore[type-arg]
    """``drill run --policy``: the parent isolates, the child (``--in-child``) drills."""
    from drill.errors import UsageError
    from drill.records.db import open_database, resolve_url, safe_url
    from drill.records.store import Records

    if explicit != (None, "latest"):
        raise UsageError("--policy names the run and how to select its checkpoint; drop --root/--checkpoint")
    pol = _load_policy(path)
    if in_child:
        from drill.cli.render import outcome_document
        from drill.policy.request import request_from_policy
        from drill.runner import run_drill

        database = open_database(db)
        signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            outcome = run_drill(request_from_policy(pol, trigger), Records(database))
        except KeyboardInterrupt:
            raise fail("interrupted: the drill is recorded as aborted", ExitCode.INTERRUPTED) from None
        finally:
            database.close()
        print_json(outcome_document(outcome, safe_url(database.url)))
        raise typer.Exit(int(outcome.exit_code))

    from drill.scheduling.isolate import run_isolated

    url = resolve_url(db)
    database = open_database(url)
    try:
        result = run_isolated(pol, url, Records(database), trigger="policy" if trigger == "manual" else trigger)
        record = Records(database).get(result.drill_id) if result.drill_id is not None else None
    finally:
        database.close()
    code = _exit_for(result.status, result.document)
    if json:
        print_json(
            {
                "policy": pol.name,
                "drill": result.document or record,
                "status": result.status,
                "alerts": [{"channel": d.channel, "target": d.target, "delivered": d.delivered, "attempts": d.attempts, "error": d.error} for d in result.deliveries],
            }
        )
    if result.status != "passed":
        stderr().print(f"drill: {result.status}: policy {pol.name}: drill #{result.drill_id}: {result.message}", markup=False)
    raise typer.Exit(code)


def _exit_for(status: str, document: dict | None) -> int:  # type: ignore[type-arg]
    if document is not None and "exit_code" in document:
        return int(document["exit_code"])
    return int(
        {"passed": ExitCode.PASSED, "failed": ExitCode.FAILED, "slo_breach": ExitCode.SLO_BREACH, "aborted": ExitCode.INTERRUPTED}.get(
            status, ExitCode.ERROR
        )
    )


policy_app = typer.Typer(cls=OneLineErrors, help="Validate policy files.", no_args_is_help=True, rich_markup_mode=None)
scheduler_app = typer.Typer(cls=OneLineErrors, help="Run drills on each policy's cron schedule.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(policy_app, name="policy")
app.add_typer(scheduler_app, name="scheduler")


@policy_app.command("check")
@error_boundary
def policy_check(
    files: Annotated[list[Path], typer.Argument(help="Policy files to validate.")],
    json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Validate policy files: every problem with its file, line, field and why.

    Unknown keys are errors (typos must not be ignored), as are invalid cron expressions,
    unknown selections and contradictory settings. Exits 2 if any file is invalid.

    Example: drill policy check policies/*.yaml
    """
    from drill.policy import PolicyError, load_policy

    report = []
    for f in files:
        try:
            pol = load_policy(f)
            report.append({"file": str(f), "valid": True, "name": pol.name, "root": pol.checkpoints.root, "problems": []})
        except PolicyError as exc:
            report.append({"file": str(f), "valid": False, "problems": [str(p) for p in exc.problems]})
    if json:
        print_json(report)
    else:
        out, err = stdout(), stderr()
        for r in report:
            if r["valid"]:
                out.print(f"ok: {r['file']} (policy {r['name']}, root {r['root']})", markup=False)
            for p in r["problems"]:
                err.print(p, markup=False)
    if not all(r["valid"] for r in report):
        raise typer.Exit(int(ExitCode.USAGE))


@scheduler_app.command("start")
@error_boundary
def scheduler_start(
    policies: Annotated[list[Path], typer.Argument(help="Policy files to schedule (each needs a schedule: section).")],
    concurrency: Annotated[int, typer.Option("--concurrency", help="At most this many drills at once, all policies together.")] = 1,
    grace: Annotated[float, typer.Option("--grace", help="On SIGTERM/SIGINT, seconds a running drill gets to finish.")] = 60.0,
    heartbeat: Annotated[float, typer.Option("--heartbeat", help="Seconds between heartbeats (the lease lasts 6 of them).")] = 5.0,
    db: DbOption = None,
    debug: DebugOption = False,
) -> None:
    """Run drills on each policy's cron schedule until stopped (SIGTERM/SIGINT).

    Each drill runs in its own child process under the policy's timeout and memory limit;
    jobs persist in the record database; one scheduler per database (a lease).

    Example: drill scheduler start policies/demo.yaml --concurrency 2
    """
    import logging

    from drill.errors import UsageError
    from drill.records.db import resolve_url
    from drill.scheduling.scheduler import DrillScheduler

    if concurrency < 1:
        raise UsageError("--concurrency must be at least 1")
    loaded = [_load_policy(p) for p in policies]
    names = [p.name for p in loaded]
    if len(set(names)) != len(names):
        raise UsageError(f"two policies share a name: {', '.join(sorted(n for n in names if names.count(n) > 1))}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    DrillScheduler(loaded, resolve_url(db), concurrency=concurrency, grace=grace, heartbeat=heartbeat, lease_ttl=6 * heartbeat).run()


@scheduler_app.command("status")
@error_boundary
def scheduler_status(db: DbOption = None, json: JsonOption = False, debug: DebugOption = False) -> None:
    """Show whether a scheduler is alive, and each policy's next fire time and last verdict.

    Exits 0 when a scheduler is alive, 3 when none is.

    Example: drill scheduler status --json
    """
    from drill.records.db import open_database
    from drill.records.store import Records

    database = open_database(db)
    try:
        records = Records(database)
        state = records.scheduler_state()
        names = sorted(set(state["jobs"]) | set((state["scheduler"] or {}).get("policies", [])))
        state["policies"] = {n: {"next_fire": state["jobs"].get(n), **records.policy_summary(n)} for n in names}
    finally:
        database.close()
    if json:
        print_json(state)
    else:
        from drill.cli.render import render_scheduler

        render_scheduler(stdout(), state)
    if not state["alive"]:
        raise typer.Exit(int(ExitCode.NOTHING_TO_DRILL))


@app.command("last-good")
@error_boundary
def last_good(
    root: Annotated[str, typer.Option("--root", help="Run directory holding the checkpoints.")],
    db: DbOption = None,
    json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Print the newest retained checkpoint whose latest drill passed.

    For resume scripts: restart from a checkpoint proven restorable, not merely the newest
    on disk. Prints its path on stdout; exits 3 when no retained checkpoint has passed.

    Example: torchrun train.py --resume "$(drill last-good --root /ckpt/run7)"
    """
    import os

    from drill.discover import discover
    from drill.errors import NothingToDrill
    from drill.records.db import open_database
    from drill.records.store import Records
    from drill.storage import storage_for

    root_key = os.path.abspath(root) if "://" not in root else root
    try:
        found = discover(storage_for(root_key), root_key)
    except OSError as exc:
        raise NothingToDrill(f"run root {root} cannot be listed ({exc.strerror or exc})") from None
    database = open_database(db)
    try:
        good = Records(database).last_good(root_key, [c.uri for c in found.checkpoints])
    finally:
        database.close()
    if good is None:
        raise NothingToDrill(f"no retained checkpoint under {root} has passed its latest drill", hint=f"drill one: drill run --root {root}")
    if json:
        print_json({"checkpoint": good["checkpoint"], "drill_id": good["id"], "drilled_at": good["started_at"]})
    else:
        sys.stdout.write(good["checkpoint"]["uri"] + "\n")


@app.command()
@error_boundary
def seal(
    checkpoint: Annotated[str, typer.Argument(help="Checkpoint directory to seal.")],
    force: Annotated[bool, typer.Option("--force", help="Replace a manifest that seals different content.")] = False,
    json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Write drill-manifest.json into a checkpoint: every file's size and xxh3-128 digests.

    Costs about one read of the files. An identical manifest is left alone; a different one
    means the checkpoint changed after sealing, and is replaced only with --force.

    Example: drill seal ./demo-run/step-100
    """
    import os

    from drill.errors import IntegrityConflict, NothingToDrill
    from drill.integrity.manifest import SealConflict
    from drill.integrity.manifest import seal as seal_checkpoint
    from drill.units import human_bytes

    if not os.path.isdir(checkpoint):
        raise NothingToDrill(f"{checkpoint} is not a checkpoint directory")
    try:
        result = seal_checkpoint(checkpoint, force=force)
    except SealConflict as exc:
        raise IntegrityConflict(str(exc), hint=f"verify it first: drill verify {checkpoint}") from None
    m = result.manifest
    doc = {"manifest": result.path, "written": result.written, "step": m.step, "files": len(m.files), "bytes": m.total_bytes}
    if json:
        print_json(doc)
        return
    verb = "sealed" if result.written else "already sealed (identical manifest)"
    stdout().print(f"{verb}: {len(m.files)} files, {human_bytes(m.total_bytes)} → {result.path}", markup=False)


@app.command()
@error_boundary
def verify(
    checkpoint: Annotated[str, typer.Argument(help="Checkpoint directory, or a single torch.save / safetensors file.")],
    sample: SampleOption = "all",
    require_sealed: RequireSealedOption = False,
    coverage_days: CoverageDaysOption = 7.0,
    db: DbOption = None,
    json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Verify a checkpoint's bytes without loading its tensors.

    Sealed: every file's size and digests against drill-manifest.json (and a framework's own
    manifest, if any). Unsealed: a structural proof — DCP metadata against the files, a
    torch.save zip's CRC-32s, a safetensors header's offsets. Updates the coverage ledger.

    Example: drill verify ./demo-run/step-100 --sample auto
    """
    from drill.cli.render import render_check
    from drill.records.db import open_database
    from drill.records.store import Records
    from drill.units import human_bytes, human_seconds
    from drill.verifier import verify_checkpoint

    spec = parse_sample_option(sample)
    database = open_database(db)
    try:
        outcome = verify_checkpoint(
            checkpoint, sample=spec, require_sealed=require_sealed, records=Records(database), coverage_days=coverage_days
        )
    finally:
        database.close()
    r = outcome.result
    if json:
        print_json(
            {
                "checkpoint": outcome.uri,
                "status": r.status.value,
                "summary": r.summary,
                "seconds": outcome.seconds,
                "bytes_hashed": outcome.bytes_hashed,
                "evidence": r.evidence,
                "findings": [f.to_dict() for f in r.findings],
            }
        )
    else:
        out = stdout()
        render_check(out, r)
        out.print(f"{human_bytes(outcome.bytes_hashed)} hashed in {human_seconds(outcome.seconds)}", markup=False, style="dim")
    if outcome.exit_code != ExitCode.PASSED:
        first = next(f for f in r.findings if f.severity.value == "error")
        stderr().print(f"drill: failed: {first.message}", markup=False)
    raise typer.Exit(int(outcome.exit_code))


@app.command()
@error_boundary
def demo(
    directory: Annotated[Path, typer.Argument(help="New run directory to write (must be empty or absent).")],
    steps: Annotated[int, typer.Option(help="Optimizer steps to train (the run goes on past its last save).")] = 110,
    save_every: Annotated[int, typer.Option("--save-every", help="Save a DCP checkpoint every K steps.")] = 20,
    keep: Annotated[int, typer.Option(help="Keep the last L checkpoints (older ones are deleted).")] = 3,
    n_layer: Annotated[int, typer.Option("--n-layer", help="Transformer blocks.")] = 2,
    n_embd: Annotated[int, typer.Option("--n-embd", help="Embedding width (≈ 12·layers·width² parameters).")] = 64,
    json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Train a small deterministic transformer and write a real run with DCP checkpoints.

    The run directory gets run.json (the configuration), drill-steps.jsonl (loss, grad norm
    and batch fingerprint per step) and step-N/ checkpoints holding model, optimizer, LR
    scheduler, data loader, RNG and train state.

    Example: drill demo ./demo-run --steps 100 --save-every 20 --keep 3
    """
    from drill.demo import DemoConfig, train
    from drill.errors import UsageError

    try:
        cfg = DemoConfig(steps=steps, save_every=save_every, keep=keep, n_layer=n_layer, n_embd=n_embd)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise UsageError(f"{directory} exists and is not an empty directory; the demo writes a fresh run")
    err = stderr()
    with err.status("training", spinner="dots") as status:
        result = train(
            directory,
            cfg,
            on_step=lambda r: status.update(f"training: step {r.step}/{cfg.steps}, loss {r.loss:.4f}"),
        )
    doc = {
        "run_dir": str(directory.resolve()),
        "steps": cfg.steps,
        "seconds": result.seconds,
        "first_loss": result.losses[0],
        "last_loss": result.losses[-1],
        "saved": result.saved,
        "retained": [f"step-{s}" for s in result.retained],
    }
    if json:
        print_json(doc)
        return
    out = stdout()
    out.print(
        f"trained {cfg.steps} steps in {result.seconds:.1f} s: loss {doc['first_loss']:.4f} → {doc['last_loss']:.4f}",
        markup=False,
    )
    out.print(f"retained checkpoints: {', '.join(doc['retained'])} in {doc['run_dir']}", markup=False)
    out.print(f"next: drill run --root {directory} --checkpoint latest", markup=False, style="dim")


@app.command()
@error_boundary
def history(
    root: Annotated[str | None, typer.Option("--root", help="Only drills of this run directory.")] = None,
    limit: Annotated[int, typer.Option(help="Show at most this many drills, newest first.")] = 50,
    db: DbOption = None,
    json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """List recorded drills, newest first: what was drilled, when, verdict, latency.

    Example: drill history --root ./demo-run
    """
    import os

    from drill.cli.render import render_history
    from drill.records.db import open_database
    from drill.records.store import Records

    database = open_database(db)
    try:
        root_key = os.path.abspath(root) if root and "://" not in root else root
        drills = Records(database).history(run_root=root_key, limit=limit)
    finally:
        database.close()
    if json:
        print_json(drills)
    elif not drills:
        stderr().print("no drills recorded" + (f" for {root}" if root else ""), markup=False)
    else:
        render_history(stdout(), drills)


@app.command()
@error_boundary
def show(
    drill_id: Annotated[int, typer.Argument(help="The drill's id, as `drill history` lists it.")],
    db: DbOption = None,
    json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Show one drill with every check's evidence and findings.

    Example: drill show 12 --json
    """
    from drill.cli.render import render_drill
    from drill.records.db import open_database
    from drill.records.store import Records

    database = open_database(db)
    try:
        doc = Records(database).get(drill_id)
    finally:
        database.close()
    if json:
        print_json(doc)
    else:
        render_drill(stdout(), doc)


@db_app.command("upgrade")
@error_boundary
def db_upgrade(db: DbOption = None, debug: DebugOption = False) -> None:
    """Migrate the record database's schema to this drill's version (Alembic head).

    Needed for PostgreSQL after installing a new drill; the embedded SQLite upgrades itself.

    Example: drill db upgrade --db postgresql://drill@db.internal/drill
    """
    from drill.records.db import resolve_url, safe_url, upgrade

    url = resolve_url(db)
    before, after = upgrade(url)
    if before == after:
        stdout().print(f"{safe_url(url)} is up to date (revision {after})", markup=False)
    else:
        stdout().print(f"{safe_url(url)} upgraded from {before or 'empty'} to {after}", markup=False)


@db_app.command("status")
@error_boundary
def db_status(db: DbOption = None, json: JsonOption = False, debug: DebugOption = False) -> None:
    """Show the database's schema revision next to the one this drill needs.

    Example: drill db status --db postgresql://drill@db.internal/drill
    """
    from drill.records.db import schema_status

    status = schema_status(db)
    if json:
        print_json(status)
        return
    state = "up to date" if status["current"] == status["head"] else "behind: run `drill db upgrade`"
    stdout().print(f"{status['url']}: revision {status['current'] or 'none'}, drill needs {status['head']} ({state})", markup=False)
    if status["current"] != status["head"]:
        raise typer.Exit(int(ExitCode.DATABASE))


def main() -> None:
    app()
