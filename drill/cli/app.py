"""``drill``: the command-line skin over the library.

Each command lives in a small module (``run``, ``records``, ``integrity``, ``nightly``,
``demo``): it parses its flags, makes one library call and renders the result. This module
only assembles them, with one error boundary for all.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from drill import __version__
from drill.cli import audit, demo, integrity, nightly, records, reports, run, submit
from drill.cli.common import error_boundary, stderr, terminate_as_interrupt
from drill.errors import ExitCode

EXIT_CODES = """\
Exit codes: 0 passed · 1 failed (a check found a problem) · 2 usage error ·
3 nothing to drill (root missing, no complete checkpoint, step not retained) ·
4 database unreachable or schema not at head · 5 drill error (recorded as error) ·
6 SLO breach (checks passed, too slow) · 7 another scheduler holds the lease ·
70 internal error (a bug; --debug shows the traceback) · 130 interrupted by SIGINT ·
143 stopped by SIGTERM (both recorded as aborted)."""


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


def _group(help: str, **kw: Any) -> typer.Typer:
    return typer.Typer(cls=OneLineErrors, help=help, no_args_is_help=True, add_completion=False, rich_markup_mode=None, **kw)


app = _group(
    "Restore drills for PyTorch training checkpoints: prove that a run can really resume.",
    name="drill",
    epilog=EXIT_CODES,
    pretty_exceptions_enable=False,
)
db_app = _group("Manage the record database's schema.")
policy_app = _group("Validate policy files.")
scheduler_app = _group("Run drills on each policy's cron schedule.")
audit_app = _group("Check the tamper-evident drill log.")
app.add_typer(audit_app, name="audit")
app.add_typer(db_app, name="db")
app.add_typer(policy_app, name="policy")
app.add_typer(scheduler_app, name="scheduler")

for group, name, command in (
    (app, "run", run.run),
    (app, "seal", integrity.seal),
    (app, "verify", integrity.verify),
    (app, "demo", demo.demo),
    (app, "history", records.history),
    (app, "show", records.show),
    (app, "last-good", nightly.last_good),
    (app, "report", reports.report),
    (app, "metrics", reports.metrics),
    (app, "goodput", reports.goodput),
    (app, "submit", submit.submit),
    (db_app, "upgrade", records.db_upgrade),
    (db_app, "status", records.db_status),
    (db_app, "flush", records.db_flush),
    (policy_app, "check", nightly.policy_check),
    (scheduler_app, "start", nightly.scheduler_start),
    (scheduler_app, "status", nightly.scheduler_status),
    (audit_app, "verify", audit.audit_verify),
):
    group.command(name)(error_boundary(command))


def _version(value: bool) -> None:
    if value:
        typer.echo(f"drill {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")] = False,
) -> None:
    pass


def main() -> None:
    from drill.proc import claim_process

    claim_process()
    terminate_as_interrupt()
    try:
        app()
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):
            raise
        leave(exc.code or 0)
    leave(0)


def leave(code: int) -> None:
    """End the process once the command is done, without the interpreter's teardown: freeing
    torch's thousands of modules one by one takes longer than many a drill (0.9 s here). Exit
    handlers still run (logging, temporary directories), streams are flushed; a thread still
    at work (a record being written) gets the ordinary, waiting exit instead."""
    import atexit
    import os
    import threading

    if any(t.is_alive() and not t.daemon and t is not threading.main_thread() for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
