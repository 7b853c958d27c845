"""Child processes of drill: a clean interpreter that dies with its parent.

A child starts as ``python -I`` (isolated: no ``PYTHON*`` variables, no user site, and — unlike
``python -m`` — not the current directory first on ``sys.path``), then takes the parent's
import path minus anything inside a directory it must not trust (the run directory, the
checkpoint). A module planted in a run directory (``xxhash.py``, ``torch.py``, a module
``run.json`` names) is therefore never imported by drill's children, wherever drill was
started from.
"""

from __future__ import annotations

import functools
import io
import json
import os
import resource
import signal
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

PR_SET_PDEATHSIG = 1

_BOOT = (
    "import sys, json; sys.path[:] = json.loads(sys.argv[1]) + [p for p in sys.path if p.startswith(sys.base_prefix)]; "
    "import runpy; sys.argv = sys.argv[2:]; runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"
)


_BOOT_OTHER = (
    "import sys, os, json; u = json.loads(sys.argv[1]); "
    "sys.path[:] = [p for p in sys.path if not any(os.path.abspath(p or '.') == d or os.path.abspath(p or '.').startswith(d + os.sep) for d in u)]; "
    "import runpy; sys.argv = sys.argv[2:]; runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"
)
"""The boot of another environment's interpreter: its own import path, less the untrusted directories."""

_claimed = False


def claim_process() -> None:
    """Say that drill's command line runs this process from its first line: nothing but drill
    has run in it (no torch operation, no thread it did not start), so drill may fork it."""
    global _claimed
    _claimed = True


def process_claimed() -> bool:
    return _claimed


def working_directory() -> str | None:
    """This process's working directory; None when it was removed (every relative path, and
    anything that asks for the directory, then fails with ``FileNotFoundError``)."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        return None


STREAMS = ((0, "stdin"), (1, "stdout"), (2, "stderr"))


def standard_streams() -> None:
    """The console script's standard streams, made safe to write before anything else runs.

    A stream that is closed (``drill verify CKPT >&-``, a supervisor that starts drill without
    them) gets ``/dev/null`` in its place: what drill would print there is discarded, as if
    written to it, and the exit code still says what happened. Left closed, the next file drill
    opens would take its number — a database opened as descriptor 1 would receive whatever a
    child process prints — and Python's stream for it is None, which every ``print`` trips on.

    stdout and stderr are then written through :class:`_Checked`: the first write to stdout
    that fails (a full disk, a pipe whose reader went away) raises
    :class:`~drill.errors.OutputUnwritable` — a one-line error and exit 5, never a pass or a
    failure the output was to say, never an internal error — and what follows is discarded, so
    the exit's own flush does not fail again. A failed write to stderr is discarded: nothing
    could say it. A character the stream's encoding cannot hold is escaped (:func:`_errors`)."""
    for fd, _ in STREAMS:
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: this one, the lower ones being open
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        if fd == 0 and sys.stdin is None:
            sys.stdin = open(0, encoding="utf-8", closefd=False)  # the process's, for its life
            setattr(sys, "__stdin__", sys.stdin)  # noqa: B010 - a name typeshed holds final
    for fd, name in STREAMS[1:]:
        old = getattr(sys, name)
        if old is not None:
            old.flush()
        raw = _Checked(fd, name, raises=fd == 1)
        stream = io.TextIOWrapper(
            io.BufferedWriter(raw),
            encoding=getattr(old, "encoding", None) or "utf-8",
            errors=_errors(getattr(old, "errors", None)),
            line_buffering=getattr(old, "line_buffering", fd == 2),
            write_through=getattr(old, "write_through", False),
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _errors(was: str | None) -> str:
    """How a stream of drill's writes what its encoding cannot hold: as before, except where
    that was to fail — a character an ASCII terminal cannot show (``PYTHONIOENCODING=ascii``:
    the arrows and dashes of drill's tables) is written as its ``\\u`` escape instead of
    ending the command. JSON is ASCII whatever the stream (``json.dumps``' default)."""
    return "backslashreplace" if was in (None, "strict") else was


class _Checked(io.FileIO):
    """A standard stream's descriptor (:func:`standard_streams`): its first failed write raises
    :class:`~drill.errors.OutputUnwritable` where ``raises`` (stdout), and every write after a
    failure is discarded."""

    def __init__(self, fd: int, name: str, raises: bool) -> None:
        super().__init__(fd, "w", closefd=False)
        self.stream, self.raises, self.failed = name, raises, False

    def write(self, data: Any) -> int:
        if self.failed:
            return memoryview(data).nbytes
        try:
            return super().write(data)
        except BlockingIOError:  # a non-blocking descriptor: the buffer above handles it
            raise
        except OSError as exc:
            self.failed = True
            if not self.raises:
                return memoryview(data).nbytes
            from drill.errors import OutputUnwritable

            why = exc.strerror or str(exc)
            raise OutputUnwritable(f"cannot write to {self.stream}: {why}") from None


def may_fork() -> bool:
    """Whether this process may fork a worker now: it is drill's command line (nothing else
    has run in it), on Linux (macOS's frameworks do not survive a fork), with no second thread
    (whose locks the fork would copy held)."""
    import threading

    return _claimed and sys.platform.startswith("linux") and threading.active_count() == 1


def death_signal() -> Callable[[], None]:
    """A call that, made in a child, has the kernel kill the child when this process ends
    (``prctl(PR_SET_PDEATHSIG, SIGKILL)``). Resolved once, in the process that asks — ask
    before forking, so the child neither imports nor loads a library: a module lock another
    thread held at the fork stays held in the child, and each worker would pay ``ctypes``' import
    (4-7 ms) before its first byte. Where there is no such call (not Linux), a call that does
    nothing: the next drill's orphan recovery still closes the record."""
    global _death_signal
    if _death_signal is None:
        try:
            import ctypes

            prctl = ctypes.CDLL(None, use_errno=True).prctl
            _death_signal = functools.partial(prctl, PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            _death_signal = _nothing
    return _death_signal


def _nothing() -> None:
    pass


_death_signal: Callable[[], None] | None = None


def die_with_parent(parent: int) -> None:
    """In a child forked by ``parent`` (its pid, taken before the fork): killed when drill ends,
    with default signal handling (drill's handlers raise into drill's own code) and no pending
    alarm. A child whose parent is already gone exits at once. The parent asks
    :func:`death_signal` before it forks."""
    death_signal()()
    if os.getppid() != parent:  # it died before the death signal was armed
        os._exit(1)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM):
        signal.signal(sig, signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_REAL, 0)


def reap(pids: Iterable[int]) -> None:
    """Wait for each forked child; one still running (its parent no longer needs it, or was
    interrupted) is killed first."""
    for pid in pids:
        try:
            if os.waitpid(pid, os.WNOHANG) == (0, 0):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def write_all(fd: int, data: bytes | bytearray) -> None:
    """Write all of ``data`` to ``fd`` (a pipe takes a write in parts); for forked children,
    which import nothing."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def inside(path: str, directories: Iterable[str]) -> bool:
    """Whether ``path`` is one of ``directories`` or lies under one (symlinks resolved)."""
    real = os.path.realpath(path)
    for d in directories:
        base = os.path.realpath(d)
        if real == base or real.startswith(base.rstrip(os.sep) + os.sep):
            return True
    return False


def trusted_path(untrusted: Iterable[str]) -> list[str]:
    """This process's ``sys.path`` (``''`` meaning the current directory) without anything
    under ``untrusted``: a child never imports from more places than its parent did."""
    untrusted = [u for u in untrusted if u and "://" not in u]
    absolute = [os.path.abspath(p or os.curdir) for p in sys.path]
    return [p for p in dict.fromkeys(absolute) if not inside(p, untrusted)]


def python_command(module: str, *args: str, untrusted: Iterable[str] = (), python: str | None = None) -> list[str]:
    """The command line that runs ``python -m module args…`` in an isolated interpreter: this
    one, on this process's import path; or ``python`` (another environment's) on its own."""
    if python is not None:
        drop = [os.path.abspath(u) for u in untrusted if u and "://" not in u]
        return [python, "-I", "-c", _BOOT_OTHER, json.dumps(drop), module, *args]
    return [sys.executable, "-I", "-c", _BOOT, json.dumps(trusted_path(untrusted)), module, *args]


def child_preexec(memory: int | None = None) -> Callable[[], None]:
    """The function a child runs before exec (``preexec_fn``): die with the parent; cap the
    address space. Built in the parent, so the child imports nothing."""
    arm = death_signal()
    cap = memory if memory and memory < NO_CAP else None  # past 2^62 bytes: no cap (setrlimit could not take it)

    def setup() -> None:
        arm()
        if cap:
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    return setup


NO_CAP = 1 << 62
"""An address-space cap at or past this many bytes (4 EiB) is none: what no host has."""


POLL = 3600.0
"""The longest single wait on a child's pipe (a poll takes at most 24.8 days)."""


def message_by(conn: Any, deadline: float) -> bool:
    """Whether a message from ``conn`` is ready before ``deadline`` (``time.monotonic()``),
    waiting in polls of at most :data:`POLL` seconds: a deadline years away (``--timeout
    1e300``, a policy's ``timeout: 99999999999d``) is a long wait, not an ``OverflowError``."""
    while (left := deadline - time.monotonic()) > 0:
        if conn.poll(min(left, POLL)):
            return True
    return False
