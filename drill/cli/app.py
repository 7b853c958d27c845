"""``drill``: the command-line skin over the library.

Each command lives in a small module (``run``, ``records``, ``integrity``, ``nightly``,
``demo``): it parses its flags, makes one library call and renders the result. This module
only assembles them, with one error boundary for all.
"""

from __future__ import annotations

import math
import sys
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from drill import __version__
from drill.cli.common import error_boundary, stderr, terminate_as_interrupt
from drill.errors import DrillError, ExitCode

EXIT_CODES = """\
Exit codes: 0 passed · 1 failed (a check found a problem) · 2 usage error ·
3 nothing to drill (root missing, no complete checkpoint, step not retained) ·
4 database unreachable or schema not at head · 5 error: drill's or the storage's, not
the checkpoint's · 6 SLO breach (checks passed, too slow) · 7 another scheduler holds the
lease · 8 verify proved nothing (no seal, no structural proof) · 70 internal error (a bug;
--debug shows the traceback) · 130 interrupted by SIGINT · 143 stopped by SIGTERM (both
recorded as aborted)."""


class OneLineErrors(TyperGroup):
    """Usage errors as one ``drill: error: …`` line on stderr with exit code 2, not a box.

    A group's commands are built when they are first looked up (``lazy``: name → (module,
    function) under ``drill.cli``): a command imports only its own module, so ``drill verify``
    does not pay for ``drill run``'s imports. Help and listings build them all.
    """

    lazy: dict[str, tuple[str, str]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = _Commands(self.lazy, dict(self.commands))

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        try:
            kwargs["standalone_mode"] = False  # errors come back here, rendered as one line
            rv = super().main(*args, **kwargs)
        except typer.Abort:
            rv = int(ExitCode.INTERRUPTED)
        except typer.TyperException as exc:  # click's usage errors, as vendored by typer
            stderr().print(f"drill: error: {exc.format_message()}", markup=False)
            rv = getattr(exc, "exit_code", int(ExitCode.USAGE))
        except DrillError as exc:  # outside a command: its output unwritable while options are read (--version)
            stderr().print(f"drill: error: {exc.message}", markup=False)
            rv = int(exc.exit_code)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)


class _Commands(dict):
    """A group's commands by name, in the order ``--help`` lists them; each lazy one is
    imported and converted by typer the first time it is looked up."""

    def __init__(self, lazy: dict[str, tuple[str, str]], built: dict[str, Any]) -> None:
        super().__init__({name: None for name in lazy} | built)
        self._lazy = lazy

    def __getitem__(self, name: str) -> Any:
        command = super().__getitem__(name)
        if command is None:
            command = self[name] = _build(name, *self._lazy[name])
        return command

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default

    def values(self) -> Any:
        return [self[name] for name in self]

    def items(self) -> Any:
        return [(name, self[name]) for name in self]


HELP = {"help_option_names": ["-h", "--help"]}


def _build(name: str, module: str, function: str) -> Any:
    """The click command for ``drill.cli.<module>.<function>``, as typer would have built it
    in the group, behind the shared error boundary."""
    import importlib

    single = typer.Typer(
        add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False, context_settings=HELP
    )
    single.command(name)(error_boundary(getattr(importlib.import_module(f"drill.cli.{module}"), function)))
    command = typer.main.get_command(single)
    command.name = name
    for param in command.params:
        param.type_cast_value = _held_to_limits(param.name, param.type_cast_value)  # type: ignore[method-assign]
    command.parse_args = _given_once(command, command.parse_args)  # type: ignore[method-assign]
    return command


def _given_once(command: Any, parse: Any) -> Any:
    """``parse`` (a command's argument parsing), refusing an option that takes one value given
    more than once: click keeps the last (``--readers 1,2 --readers 8`` drilled 8 readers, the
    first silently dropped); which one was meant is the user's to say."""
    once = {
        opt: param.opts[0]
        for param in command.params
        if getattr(param, "param_type_name", "") == "option" and not (param.multiple or param.is_flag or param.count)
        for opt in (*param.opts, *param.secondary_opts)
    }

    def parse_args(ctx: Any, args: list[str]) -> Any:
        seen: dict[str, int] = {}
        for token in args:
            if token == "--":
                break
            name = once.get(token.split("=", 1)[0]) if token.startswith("--") else once.get(token[:2])
            if name is not None:
                seen[name] = seen.get(name, 0) + 1
        repeated = [name for name, n in seen.items() if n > 1]
        if repeated:
            raise typer.BadParameter(f"given {seen[repeated[0]]} times: give it once", ctx=ctx, param_hint=repeated[0])
        return parse(ctx, args)

    return parse_args


def _held_to_limits(name: str | None, cast: Any) -> Any:
    """``cast`` (a parameter's conversion), refusing what no command can mean, for every
    option and argument of every command in this one place: a blank value typed on the command
    line (``--root ""``, or ``drill runs "$RUN"`` with the variable unset, would otherwise be the
    working directory, match nothing, or fall back to a default), and an integer no record can
    hold (``drill show 10**21``: SQL integers are 64-bit), or a number that is not finite
    (``--timeout nan``, ``--coverage-days inf``)."""

    def checked(ctx: Any, value: Any) -> Any:
        given = value if isinstance(value, (tuple, list)) else (value,)
        source = getattr(ctx.get_parameter_source(name), "name", None) if name else None
        if source == "COMMANDLINE" and any(isinstance(v, str) and not v.strip() for v in given):
            raise typer.BadParameter(BLANK, ctx=ctx)
        converted = cast(ctx, value)
        numbers = converted if isinstance(converted, (tuple, list)) else (converted,)
        if any(isinstance(v, int) and not isinstance(v, bool) and not INT64[0] <= v <= INT64[1] for v in numbers):
            raise typer.BadParameter(OUT_OF_RANGE, ctx=ctx)
        if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
            raise typer.BadParameter(NOT_FINITE, ctx=ctx)
        return converted

    return checked


BLANK = "blank: nothing given (as a path, it would mean the working directory)"
INT64 = (-(1 << 63), (1 << 63) - 1)
NOT_FINITE = "not a finite number (nan, inf and values past 1.8e308 mean nothing here)"
OUT_OF_RANGE = f"out of range: a record holds integers from {INT64[0]} to {INT64[1]}"


def _group(help: str, commands: dict[str, tuple[str, str]], *, completion: bool = False, **kw: Any) -> typer.Typer:
    cls = type("OneLineErrors", (OneLineErrors,), {"lazy": commands})
    return typer.Typer(
        cls=cls,
        help=help,
        no_args_is_help=True,
        add_completion=completion,
        rich_markup_mode=None,
        context_settings=HELP,
        **kw,
    )


app = _group(
    "Restore drills for PyTorch training checkpoints: prove that a run can really resume.",
    {
        "run": ("run", "run"),
        "seal": ("integrity", "seal"),
        "verify": ("integrity", "verify"),
        "demo": ("demo", "demo"),
        "history": ("records", "history"),
        "show": ("records", "show"),
        "runs": ("records", "runs"),
        "last-good": ("nightly", "last_good"),
        "report": ("reports", "report"),
        "metrics": ("reports", "metrics"),
        "goodput": ("reports", "goodput"),
        "burst": ("burst", "burst"),
        "submit": ("submit", "submit"),
        "verdict": ("run", "verdict"),
    },
    name="drill",
    epilog=EXIT_CODES,
    pretty_exceptions_enable=False,
    completion=True,  # --install-completion / --show-completion for bash, zsh, fish
)
app.add_typer(_group("Check the tamper-evident drill log.", {"verify": ("audit", "audit_verify")}), name="audit")
app.add_typer(
    _group(
        "Manage the record database's schema.",
        {"upgrade": ("records", "db_upgrade"), "status": ("records", "db_status"), "flush": ("records", "db_flush")},
    ),
    name="db",
)
app.add_typer(_group("Validate policy files.", {"check": ("nightly", "policy_check")}), name="policy")
app.add_typer(
    _group(
        "Run drills on each policy's cron schedule.",
        {"start": ("nightly", "scheduler_start"), "status": ("nightly", "scheduler_status")},
    ),
    name="scheduler",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"drill {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
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

    code = _flushed(code)
    if any(t.is_alive() and not t.daemon and t is not threading.main_thread() for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()
    code = _flushed(code)  # what the exit handlers printed
    os._exit(code)


def _flushed(code: int) -> int:
    """``code`` once the output is flushed — or exit 5, said on stderr, where its last bytes
    could not be written (:class:`~drill.errors.OutputUnwritable`): that is the outcome then."""
    try:
        sys.stdout.flush()
    except DrillError as exc:
        sys.stderr.write(f"drill: error: {exc.message}\n")
        code = int(exc.exit_code)
    sys.stderr.flush()
    return code
