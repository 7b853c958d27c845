"""``drill audit verify``: is the drill log as it was recorded?"""

from __future__ import annotations

from typing import Annotated

import typer

from drill.cli.common import DbOption, DebugOption, JsonOption, print_json, stderr, stdout


def audit_verify(
    head: Annotated[
        str | None,
        typer.Option(
            "--head",
            help="A chain head pinned earlier (from a report, or this command): fail if the log no longer reaches it.",
        ),
    ] = None,
    keyed_from: Annotated[
        int | None,
        typer.Option(
            "--keyed-from",
            help="With an audit key introduced on an existing log: the first entry it sealed; earlier entries may lack its HMAC.",
        ),
    ] = None,
    full: Annotated[
        bool,
        typer.Option("--full", help="Accepted for older scripts: every pass is a full one now.", hidden=True),
    ] = False,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            min=1,
            help="Processes that recompute the records' digests (default: every core this process may use).",
        ),
    ] = None,
    db: DbOption = None,
    json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Verify the tamper-evident drill log: name every edited, reordered or deleted record.

    Every closed drill record is sealed into a hash chain when it closes (with an HMAC when
    $DRILL_AUDIT_KEY_FILE or $DRILL_AUDIT_KEY holds a key). Every pass checks the whole log:
    every entry (with a key, every entry must carry its HMAC), every closed record's digest,
    and that no closed record is outside the chain — a year of nightly drills in seconds. Each
    pass is recorded, intact or not: `drill metrics` reports the last one. Exit 0: intact; 1:
    not; 4: the database cannot be read (a missing schema revision included).

    Example: drill audit verify --head 674e016f49d9f5ce9b43ce43342448635adf8ef038351de13c1b005e9bfb3062
    """
    from drill.api import verify_audit_chain

    del full  # every pass is full
    report = verify_audit_chain(db=db, head=head, keyed_from=keyed_from, workers=workers)
    if json:
        print_json(report.to_dict())
    else:
        out = stdout()
        for p in report.problems:
            out.print(f"{p.subject}: {p.code}: {p.message}", markup=False)
        out.print(_summary(report), markup=False)
    if not report.intact:
        broken = sum(1 for p in report.problems if p.severity.value == "error")
        stderr().print(f"drill: audit: the drill log is NOT intact: {broken} problem(s)", markup=False)
        raise typer.Exit(1)


def _summary(report) -> str:  # type: ignore[no-untyped-def]
    if report.head is None:
        state = "empty (no drill has been sealed yet)" if report.intact else "BROKEN: no entry, yet closed records"
        return f"audit chain: {state}"
    h = report.head
    state = "intact" if report.intact else "BROKEN"
    auth = f", {report.authenticated} authenticated" if report.authenticated else ""
    auth += f", {report.unkeyed_before} sealed before the key" if report.unkeyed_before else ""
    return (
        f"audit chain {state}: {report.entries} entries, {report.records} records match{auth}; "
        f"head {h.hash} (entry {h.seq}, drill #{h.drill_id}, sealed {h.sealed_at.isoformat()[:19]}Z)"
    )
