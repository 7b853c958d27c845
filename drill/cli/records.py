"""``drill history``, ``drill show``, ``drill db upgrade|status``: reading and keeping the record."""

from __future__ import annotations

from typing import Annotated

import typer

from drill.cli.common import (
    SINCE_HELP,
    DbOption,
    DebugOption,
    JsonOption,
    exit_with,
    print_json,
    since_flag,
    stderr,
    stdout,
)
from drill.errors import ExitCode, UsageError

Since = Annotated[str | None, typer.Option("--since", help=SINCE_HELP)]
Status = Annotated[
    str | None, typer.Option("--status", help="Only drills with this verdict (passed, failed, error, …).")
]
Policy = Annotated[str | None, typer.Option("--policy", help="Only drills of this policy.")]


def history(
    root: Annotated[str | None, typer.Option("--root", help="Only drills of this run directory.")] = None,
    since: Since = None,
    status: Status = None,
    policy: Policy = None,
    limit: Annotated[int, typer.Option(help="Show at most this many drills, newest first.")] = 50,
    bursts: Annotated[
        bool, typer.Option("--bursts", help="List recorded restore bursts (drill burst) instead of drills.")
    ] = False,
    db: DbOption = None,
    json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """List recorded drills, newest first: what was drilled, when, verdict, latency.

    Each record is checked against its audit seal as it is read: any that fails it is marked,
    named on stderr, and the command exits 1.

    Example: drill history --root ./demo-run --since 7d --status failed
    """
    if bursts:
        return _bursts(root, limit, db, json)
    from drill.api import history as recorded
    from drill.verdict import DrillStatus

    after = since_flag(since)
    if status is not None:
        known = [s.value for s in DrillStatus]
        if status not in known:
            raise UsageError(f"--status: unknown verdict {status!r}: expected one of {', '.join(known)}")
    if limit < 1:
        raise UsageError(f"--limit: must be at least 1, not {limit}")
    drills = recorded(db=db, root=root, limit=limit, since=after, status=status, policy=policy)
    if json:
        print_json([d.to_document(with_checks=False) for d in drills])
    elif not drills:
        stderr().print(
            "no drills recorded" + (" matching the filters" if root or since or status or policy else ""), markup=False
        )
    else:
        from drill.cli.render import render_history

        render_history(stdout(), drills)
    _refuse_broken(drills)


def _refuse_broken(drills: list) -> None:
    """Every record shown that fails its audit seal is named on stderr, and the command exits 1."""
    broken = [d for d in drills if d.seal is not None and d.seal.broken]
    for d in broken:
        stderr().print(f"drill: drill #{d.id} fails its audit seal: {d.seal.message}", markup=False)
    if broken:
        raise exit_with(ExitCode.FAILED)


def _bursts(root: str | None, limit: int, db: str | None, json: bool) -> None:
    from drill.api import bursts

    docs = bursts(db=db, root=root, limit=limit)
    if json:
        return print_json(docs)
    if not docs:
        stderr().print("no bursts recorded" + (" for this run" if root else ""), markup=False)
        return None
    from drill.cli.render import render_bursts

    render_bursts(stdout(), docs)
    return None


def show(
    drill_id: Annotated[
        int, typer.Argument(help="The drill's id, as `drill history` lists it (with --burst: a burst's).")
    ],
    burst: Annotated[
        bool, typer.Option("--burst", help="The id is a restore burst's (drill history --bursts).")
    ] = False,
    db: DbOption = None,
    json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Show one drill with every check's evidence and findings, its replayed steps and alerts.

    The record is checked against its audit seal as it is read: one that fails it (edited,
    inserted or resealed outside drill) is shown as such and exits 1.

    Example: drill show 12 --json
    """
    from drill.api import get_drill

    if burst:
        return _show_burst(drill_id, db, json)
    outcome = get_drill(drill_id, db=db)
    if json:
        print_json(outcome.to_document())
    else:
        from drill.cli.render import render_drill

        render_drill(stdout(), outcome)
    _refuse_broken([outcome])


def _show_burst(burst_id: int, db: str | None, json: bool) -> None:
    from drill.api import get_burst

    doc = get_burst(burst_id, db=db)
    if json:
        return print_json(doc)
    from drill.cli.render import render_burst

    render_burst(stdout(), doc)
    return None


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


def db_flush(db: DbOption = None, json: JsonOption = False, debug: DebugOption = False) -> None:
    """Deliver the verdicts spooled while the database was away, each exactly once.

    Every drill does this when it starts; this does it now (e.g. after the database is back).
    Only files that are provably drill's own are delivered (regular files of this user, mode
    0600); any other file is named and left in place. Exits 4, keeping the spool, when the
    database is still unreachable; 1 when a spooled file cannot be delivered.

    Example: drill db flush --db postgresql://drill@db.internal/drill
    """
    from drill.records.db import open_database, safe_url
    from drill.records.recorder import DatabaseRecorder

    database = open_database(db)
    try:
        result = DatabaseRecorder(database).flush()
    finally:
        database.close()
    where = safe_url(database.url)
    if json:
        print_json(
            {
                "url": where,
                "delivered": result.delivered,
                "left": result.left,
                "waiting": result.waiting,
                "rejected": result.rejected,
            }
        )
    else:
        stdout().print(
            f"delivered {result.delivered} spooled verdict(s) to {where}; {result.left} left in the spool", markup=False
        )
        for path, why in result.rejected.items():
            stderr().print(f"drill: not delivered: {path}: {why}", markup=False)
    if result.waiting:
        raise exit_with(ExitCode.DATABASE)
    if result.rejected:
        raise exit_with(ExitCode.FAILED)


def db_status(db: DbOption = None, json: JsonOption = False, debug: DebugOption = False) -> None:
    """Show the database's schema revision next to the one this drill needs.

    Exits 0 when they match, 4 when the schema is behind (run `drill db upgrade`) or ahead
    (this drill is older than the database).

    Example: drill db status --db postgresql://drill@db.internal/drill
    """
    from drill.records.db import schema_status

    status = schema_status(db)
    if json:
        print_json(
            {
                "url": status.url,
                "current": status.current,
                "head": status.head,
                "state": status.state,
                "tables": list(status.tables),
            }
        )
    else:
        advice = {
            "current": "up to date",
            "behind": "behind: run `drill db upgrade`",
            "ahead": "ahead: this drill is older than the database; install the drill that upgraded it",
        }[status.state]
        stdout().print(
            f"{status.url}: revision {status.current or 'none'}, drill needs {status.head} ({advice})", markup=False
        )
    if status.state != "current":
        raise exit_with(ExitCode.DATABASE)


def runs(
    root: Annotated[
        str | None,
        typer.Argument(help="One run directory: every checkpoint it retains. Default: every run on the record."),
    ] = None,
    no_list: Annotated[
        bool, typer.Option("--no-list", help="Do not list storage: checkpoints as drills last saw them.")
    ] = False,
    db: DbOption = None,
    json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """The whole-run view: every run, or every checkpoint of one, with its last verdict,
    what that verdict rests on, and how old it is.

    Without ROOT: one line per run on the record — checkpoints retained and proven, the last
    drill. With ROOT: each retained checkpoint (and each drilled one since purged) — proven
    restorable or not, evidence, replay, age of its last drill, bytes on storage.

    Example: drill runs /ckpt/run7
    """
    import os

    from drill.report import ReportOptions, build_report

    if root is not None and "://" not in root and os.path.exists(root) and not os.path.isdir(root):
        raise UsageError(f"{root} is not a directory: give a run directory (drill runs ./run), or none for every run")
    report = build_report(db, ReportOptions(since=None, root=root, list_storage=not no_list))
    if json:
        print_json(
            {
                "runs": [
                    {k: v for k, v in r.to_dict().items() if k not in ("drills", "goodput", "slo_breaches")}
                    for r in report.runs
                ]
            }
        )
        return
    if not report.runs:
        stderr().print("no runs on the record" if root is None else f"no drills of {root} on the record", markup=False)
        return
    from drill.cli.render import render_run, render_runs

    out = stdout()
    if root is None:
        render_runs(out, report.runs)
    else:
        for run in report.runs:
            render_run(out, run)
