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


_claimed = False


def claim_process() -> None:
    """Say that drill's command line runs this process from its first line: nothing but drill
    has run in it (no torch operation, no thread it did not start), so drill may fork it."""
    global _claimed
    _claimed = True


def process_claimed() -> bool:
    return _claimed


STREAMS = ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w"))


def standard_streams() -> None:
    """Give each standard stream that is closed (``drill verify CKPT >&-``, a supervisor that
    starts drill without them) ``/dev/null`` in its place: what drill would print there is
    discarded, as if written to it, and the exit code still says what happened. Left closed,
    the next file drill opens would take its number — a database opened as descriptor 1 would
    receive whatever a child process prints — and Python's stream for it is None, which every
    ``print`` and ``flush`` would trip on. Called first by the console script."""
    for fd, name, mode in STREAMS:
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: this one, the lower ones being open
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        if getattr(sys, name) is None:
            stream = open(fd, mode, encoding="utf-8", closefd=False)  # the process's own, for its life
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)


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


def python_command(module: str, *args: str, untrusted: Iterable[str] = ()) -> list[str]:
    """The command line that runs ``python -m module args…`` in an isolated interpreter."""
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
