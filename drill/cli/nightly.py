"""``drill policy check``, ``drill scheduler start|status``, ``drill last-good``: nightly drills."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from drill.cli.common import (
    DbOption,
    DebugOption,
    JsonOption,
    RunRootOption,
    exit_with,
    flag,
    print_json,
    stderr,
    stdout,
    timeout_flag,
)
from drill.errors import ExitCode, NothingToDrill, UsageError

if TYPE_CHECKING:
    from drill.pipeline.outcome import DrillOutcome
    from drill.policy.model import Policy


def load_policy_or_fail(path: Path) -> Policy:
    from drill.policy import PolicyError, load_policy

    try:
        return load_policy(path)
    except PolicyError as exc:
        more = f" (and {len(exc.problems) - 1} more: drill policy check {path})" if len(exc.problems) > 1 else ""
        raise UsageError(f"invalid policy: {exc.problems[0]}{more}") from None


def policy_check(
    files: Annotated[list[Path], typer.Argument(help="Policy files to validate.")],
    json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Validate policy files: every problem with its file, line, field and why.

    Unknown keys are errors (typos must not be ignored), as are invalid cron expressions,
    unknown selections and contradictory settings. A valid policy that could not run on this
    host (storage it cannot reach, no CUDA, an unset alert secret) gets warnings. Exits 2 if
    any file is invalid.

    Example: drill policy check policies/*.yaml
    """
    from drill.launch.k8s import warnings_for as pod_warnings
    from drill.policy import PolicyError, load_policy
    from drill.policy.check import warnings_for

    report: list[dict[str, Any]] = []
    for f in files:
        try:
            pol = load_policy(f)
            entry = {"file": str(f), "valid": True, "name": pol.name, "root": pol.checkpoints.root, "problems": []}
            k8s = pod_warnings(pol) if pol.allocation.launcher == "k8s" else []
            report.append({**entry, "warnings": warnings_for(pol) + k8s})
        except PolicyError as exc:
            report.append({"file": str(f), "valid": False, "problems": [str(p) for p in exc.problems], "warnings": []})
    if json:
        print_json(report)
    else:
        out, err = stdout(), stderr()
        for r in report:
            if r["valid"]:
                out.print(f"ok: {r['file']} (policy {r['name']}, root {r['root']})", markup=False)
            for p in r["problems"]:
                err.print(p, markup=False)
            for w in r["warnings"]:
                err.print(f"warning: {r['file']}: {w}", markup=False)
    if not all(r["valid"] for r in report):
        raise exit_with(ExitCode.USAGE)


def scheduler_start(
    policies: Annotated[list[Path], typer.Argument(help="Policy files to schedule (each needs a schedule: section).")],
    concurrency: Annotated[
        int, typer.Option("--concurrency", help="At most this many drills at once, all policies together.")
    ] = 1,
    grace: Annotated[
        float, typer.Option("--grace", help="On SIGTERM/SIGINT, seconds a running drill gets to finish.")
    ] = 60.0,
    heartbeat: Annotated[
        float, typer.Option("--heartbeat", help="Seconds between heartbeats (the lease lasts 6 of them).")
    ] = 5.0,
    db: DbOption = None,
    debug: DebugOption = False,
) -> None:
    """Run drills on each policy's cron schedule until stopped (SIGTERM/SIGINT).

    Each drill runs in its own child process under the policy's timeout and memory limit;
    jobs persist in the record database; one scheduler per database (a lease).

    Example: drill scheduler start policies/demo.yaml --concurrency 2
    """
    import logging

    from drill.records.db import resolve_url
    from drill.scheduling.scheduler import DrillScheduler

    if concurrency < 1:
        raise UsageError("--concurrency must be at least 1")
    if not heartbeat > 0 or not grace >= 0:
        raise UsageError("--heartbeat must be positive and --grace not negative")
    loaded = [load_policy_or_fail(p) for p in policies]
    k8s = [p.name for p in loaded if p.allocation.launcher == "k8s"]
    if k8s:
        from drill.launch.k8s_api import configured_api

        if configured_api() is None:
            raise UsageError(
                f"policy {k8s[0]} runs on Kubernetes, and no cluster is configured here (a service account, $KUBECONFIG or ~/.kube/config): "
                "configure one, or let a CronJob schedule it (drill submit --policy FILE --cron | kubectl apply -f -)"
            )
    names = [p.name for p in loaded]
    if len(set(names)) != len(names):
        raise UsageError(f"two policies share a name: {', '.join(sorted(n for n in names if names.count(n) > 1))}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    DrillScheduler(
        loaded, resolve_url(db), concurrency=concurrency, grace=grace, heartbeat=heartbeat, lease_ttl=6 * heartbeat
    ).run()


def scheduler_status(db: DbOption = None, json: JsonOption = False, debug: DebugOption = False) -> None:
    """Show whether a scheduler is alive, and each policy's next fire time and last verdict.

    Exits 0 when a scheduler is alive, 3 when none is.

    Example: drill scheduler status --json
    """
    from drill.records.db import read_database
    from drill.records.store import Records

    database = read_database(db)
    state: dict = {"alive": False, "scheduler": None, "jobs": {}, "policies": {}}
    if database is not None:
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
        raise exit_with(ExitCode.NOTHING_TO_DRILL)


def _print_last_good(good: DrillOutcome, uri: str, json: bool) -> None:
    """The checkpoint's path on stdout (data for a script, escaped for a terminal) and what its
    pass rested on on stderr; or one JSON document."""
    from drill.claims import proof_of
    from drill.text import printable

    proof = proof_of(good)
    if json:
        print_json(
            {
                "checkpoint": good.to_document(with_checks=False)["checkpoint"],
                "drill_id": good.id,
                "drilled_at": good.started_at.isoformat(),
                "proof": proof.to_dict(),
            }
        )
        return None
    sys.stdout.write(
        (printable(uri) if sys.stdout.isatty() else uri) + "\n"
    )  # data for a script, escaped for a terminal
    stderr().print(f"drill #{good.id}, {good.started_at.isoformat()[:19]}Z: {proof.describe()}", markup=False)


MinEvidence = Annotated[
    str,
    typer.Option(
        "--min-evidence",
        help="Weakest proof a pass may rest on: structural, sealed or authenticated (default structural).",
    ),
]
RequireReplay = Annotated[
    bool, typer.Option("--require-replay", help="Only a checkpoint whose passing drill also replayed bit for bit.")
]
ListingTimeout = Annotated[
    float,
    typer.Option(
        "--timeout", help="Seconds listing the run may take (a storage that never answers ends as an error, exit 5)."
    ),
]


def last_good(
    root: RunRootOption,
    min_evidence: MinEvidence = "structural",
    require_replay: RequireReplay = False,
    timeout: ListingTimeout = 300.0,
    db: DbOption = None,
    json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Print the newest retained checkpoint whose latest drill passed, and on what evidence.

    For resume scripts: restart from a checkpoint proven restorable, not merely the newest
    on disk. Its path goes to stdout; what the pass relied on (evidence, replay, parts
    accepted as missing) to stderr. A drill whose record fails its audit seal vouches for
    nothing: it is passed over, and named on stderr. Exits 3 when no retained checkpoint qualifies.

    Example: torchrun train.py --resume "$(drill last-good --root /ckpt/run7 --min-evidence sealed)"
    """
    from drill.api import last_good as proven
    from drill.claims import parse_level

    level = flag("--min-evidence", parse_level, min_evidence)
    if level == "none":
        raise UsageError(
            "--min-evidence none would vouch for a pass that proved nothing about the bytes: use structural or stronger"
        )
    broken: list = []
    good = proven(
        root, db=db, min_evidence=level, require_replay=require_replay, timeout=timeout_flag(timeout), broken=broken
    )
    for b in broken:
        where = b.checkpoint.name if b.checkpoint else b.run_root
        stderr().print(
            f"drill: passed over {where}: drill #{b.id} fails its audit seal: {b.seal.message}", markup=False
        )
    if good is None or good.checkpoint is None:
        asked = f" on {level} evidence or better" + (" with a replay" if require_replay else "")
        raise NothingToDrill(
            f"no retained checkpoint under {root} has passed its latest drill{asked}",
            hint=f"drill one: drill run --root {root}",
        )
    _print_last_good(good, good.checkpoint.uri, json)
