"""Options shared by every command, the error boundary, and the consoles.

stdout carries data (tables, ``--json`` documents); stderr carries talk (progress, errors).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

if TYPE_CHECKING:
    from rich.console import Console

from drill.errors import DrillError, ExitCode, UsageError
from drill.proc import working_directory

F = TypeVar("F", bound=Callable[..., Any])

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="Record database URL (sqlite:///PATH, postgresql://…) or an SQLite file path. "
        "Default: $DRILL_DATABASE_URL, else ~/.local/share/drill/drill.db. "
        "An SQLite file's directory must exist (only the default's is created).",
        show_default=False,
    ),
]
ROOT_HELP = "Run directory (or s3:// prefix) holding the checkpoints (step-N/, checkpoint-N/, *.pt)."
RunRootOption = Annotated[str, typer.Option("--root", help=ROOT_HELP)]
CheckpointOption = Annotated[
    str,
    typer.Option(
        "--checkpoint",
        "-c",
        help="Which checkpoint: latest, oldest, step:N, or a checkpoint by name or path (a relative one is looked for under --root first).",
    ),
]
SINCE_HELP = "Start of the window: a date (2026-11-01), a time (2026-11-01T06:00Z), a duration back from now (30d, 12h), or 'all'."


def since_flag(value: str | None) -> datetime | None:
    """``--since`` as every command takes it: a date, a time, a duration back from now, or ``all``."""
    from drill.units import parse_instant

    if value is None or value.strip().lower() == "all":
        return None
    return flag("--since", lambda v: parse_instant(v, now=datetime.now(timezone.utc)), value)


JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout instead of tables.")]
StorageGbps = Annotated[
    float | None,
    typer.Option(
        "--storage-gbps",
        help="The storage's aggregate read bandwidth in GB/s (e.g. 1500 for a 1.5 TB/s file system): "
        "R from a burst is read at min(per-reader × readers, this) instead of the ceiling measured here.",
    ),
]
SampleOption = Annotated[
    str,
    typer.Option(
        "--sample",
        help="Verify a subset: all, n/t (bucket n of t), P%, SIZE (e.g. 2GiB), auto[:P%|:SIZE] "
        "(least recently verified first). A sampled drill says it was sampled.",
    ),
]
RequireSealedOption = Annotated[
    bool,
    typer.Option(
        "--require-sealed", help="Fail a checkpoint without a drill manifest instead of accepting a structural proof."
    ),
]
CoverageDaysOption = Annotated[
    float, typer.Option("--coverage-days", help="Report the share of bytes verified within this many days.")
]
AllowClassOption = Annotated[
    list[str] | None,
    typer.Option(
        "--allow-class",
        help="Allow-list a class a layout legitimately pickles (repeatable; DCP .metadata included), e.g. mytrainer.state.TrainState.",
    ),
]
KeyFileOption = Annotated[
    str | None,
    typer.Option(
        "--key-file",
        help="File holding the seal key (keyed seals: an HMAC only its holder can produce). "
        "Default: $DRILL_SEAL_KEY_FILE, else $DRILL_SEAL_KEY.",
        show_default=False,
    ),
]
DebugOption = Annotated[bool, typer.Option("--debug", help="Show tracebacks for unexpected errors.")]
QuietOption = Annotated[
    bool, typer.Option("--quiet", "-q", help="No progress on stderr (errors and the verdict line still print).")
]


@functools.cache
def _console_class() -> type[Console]:
    """rich's console, imported when something is printed through it (``--json`` never is)."""
    from rich.console import Console

    class _Console(Console):
        """A console for people: every string it renders — table cells, messages, paths, names
        from a checkpoint — shows its control characters as escapes (:func:`drill.text.printable`),
        so a file name cannot drive the terminal, and is printed as it is named: no emoji codes
        (rich turns ``:fire:`` into a glyph even where markup is off). Styles are rich's own and
        are unaffected."""

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(soft_wrap=True, highlight=False, emoji=False, tab_size=TAB_SIZE, **kwargs)

        def render_str(self, text: str, **kwargs: Any) -> Any:
            from drill.text import printable

            return super().render_str(printable(text), **kwargs)

    return _Console


TAB_SIZE = 8
"""Columns a tab advances to (rich expands tabs to spaces; so does :class:`Out`)."""


class Out:
    """stdout or stderr for people. A line of text printed as it is (``print(..., markup=False)``,
    strings only) where rich would show no style — not a terminal, neither ``FORCE_COLOR`` nor
    ``TTY_COMPATIBLE`` set (:func:`unstyled`) — is written here exactly as rich writes it there
    (each string through :func:`~drill.text.printable`, tabs expanded, never wrapped, flushed),
    without loading rich: rich is a fifth of a ``drill verify`` of 1.2 GB run from a script.
    Everything else — markup, tables, a status line, a terminal's styles — is rich's console's
    (:attr:`rich`), loaded on first use; its other attributes are that console's."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._rich: Console | None = None
        self.plain = unstyled(getattr(sys, name))

    @property
    def rich(self) -> Console:
        if self._rich is None:
            console = _console_class()(stderr=self._name == "stderr")
            if not console.is_terminal:  # a pipe or a file: tables one row a line, not wrapped at 80
                console.width = max(console.width, 160)
            self._rich = console
        return self._rich

    def print(
        self, *objects: Any, sep: str = " ", end: str = "\n", style: str | None = None, markup: bool | None = None
    ) -> None:
        if self.plain and markup is False and all(isinstance(o, str) for o in objects):
            from drill.text import printable

            stream = getattr(sys, self._name)
            stream.write(printable(sep.join(objects)).expandtabs(TAB_SIZE) + end)
            stream.flush()
        else:
            self.rich.print(*objects, sep=sep, end=end, style=style, markup=markup)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.rich, name)


def unstyled(stream: Any) -> bool:
    """Whether rich would write ``stream`` without styles: no terminal, and no environment
    variable that makes rich treat it as one (whatever the variable's value: rich decides those)."""
    if "FORCE_COLOR" in os.environ or "TTY_COMPATIBLE" in os.environ:
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return isatty is not None and not isatty()
    except ValueError:  # closed: rich counts it as no terminal too, but let rich say so
        return False


def stdout() -> Out:
    return Out("stdout")


def stderr() -> Out:
    return Out("stderr")


def print_json(doc: Any) -> None:
    """``doc`` as strict JSON on stdout: a value that is no finite number is the string
    ``"NaN"``/``"Infinity"`` as in the records (:func:`~drill.findings.jsonable`), never the bare
    ``Infinity`` that ``jq`` and strict parsers reject."""
    from drill.findings import strict_json

    sys.stdout.write(strict_json(doc, indent=2) + "\n")
    sys.stdout.flush()


def fail(message: str, code: ExitCode, hint: str | None = None) -> typer.Exit:
    """Print ``drill: error: …`` (one line, plus an optional hint line) and return the exit."""
    err = stderr()
    err.print(f"drill: error: {message}", markup=False)
    if hint:
        err.print(f"hint: {hint}", markup=False)
    return typer.Exit(int(code))


class Terminated(KeyboardInterrupt):
    """SIGTERM outside a drill: handled like Ctrl-C, with its own exit code."""


def terminate_as_interrupt() -> None:
    """Turn SIGTERM into :class:`Terminated` (a drill installs its own handler while it runs)."""
    import signal

    def handler(signum: int, frame: object) -> None:
        raise Terminated("interrupted by SIGTERM")

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (an embedding application's business)
        pass


def error_boundary(fn: F) -> F:
    """Turn :class:`DrillError` into its one-line message and exit code; anything else is a
    bug, shown as one line unless ``--debug`` asks for the traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except DrillError as exc:
            if kwargs.get("debug"):
                raise
            raise fail(exc.message, exc.exit_code, exc.hint) from None
        except (typer.Exit, typer.Abort):
            raise
        except KeyboardInterrupt as exc:  # outside a drill (a drill records its own interrupt)
            code = ExitCode.TERMINATED if isinstance(exc, Terminated) else ExitCode.INTERRUPTED
            stderr().print(
                f"drill: aborted: {str(exc) or 'interrupted by SIGINT'} (nothing was recorded)", markup=False
            )
            raise typer.Exit(int(code)) from None
        except Exception as exc:
            if kwargs.get("debug"):
                raise
            if isinstance(exc, FileNotFoundError) and not working_directory():
                raise fail(
                    "the working directory no longer exists: a relative path cannot be resolved against it",
                    ExitCode.USAGE,
                    "cd to a directory that exists, or give absolute paths",
                ) from None
            first = (str(exc).strip().splitlines() or [""])[0]
            raise fail(
                f"internal error: {type(exc).__name__}: {first} (re-run with --debug for the traceback)",
                ExitCode.INTERNAL,
            ) from None

    return wrapper  # type: ignore[return-value]


T = TypeVar("T")


def flag(name: str, parse: Callable[[Any], T], value: Any) -> T:
    """``parse(value)``, or a usage error naming the flag: flags are checked before any I/O."""
    from drill.errors import UsageError

    try:
        return parse(value)
    except ValueError as exc:
        raise UsageError(f"{name}: {exc}") from None


def storage_bps(gbps: float | None) -> float | None:
    """``--storage-gbps`` in bytes per second: a positive number."""
    if gbps is None:
        return None
    if not gbps > 0:
        raise UsageError(f"--storage-gbps must be a positive number of GB/s, not {gbps:g}")
    return gbps * 1e9


def timeout_flag(seconds: float) -> float:
    """A command's ``--timeout``: a positive number of seconds (finite: every float parameter
    is held to that where the commands are built)."""
    if not seconds > 0:
        raise UsageError(f"--timeout must be a positive number of seconds, not {seconds:g}")
    return seconds


def exit_with(code: int) -> typer.Exit:
    return typer.Exit(int(code))


def seal_key(key_file: str | None) -> bytes | None:
    """The seal key, or a usage error that never shows it."""
    from drill.errors import UsageError
    from drill.integrity.keys import SealKeyError, load_key

    try:
        return load_key(key_file)
    except SealKeyError as exc:
        raise UsageError(str(exc)) from None


def write_output(path: str, text: str) -> None:
    """``--output``: ``text`` written to ``path`` whole or not at all (a report, a script)."""
    from drill.storage import LocalStorage

    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise UsageError(f"--output: directory {directory} does not exist")
    try:
        LocalStorage().write(
            path, text.encode(), replace=True, mode=0o666
        )  # the umask decides who may read it (a web root: 0644)
    except OSError as exc:
        raise UsageError(f"--output: cannot write {path} ({exc.strerror or exc})") from None
