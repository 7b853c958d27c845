"""SIGINT, SIGTERM and a deadline during a drill: stop at once, wherever the drill is.

A handler raises :class:`Interrupted` (or :class:`TimedOut`, on SIGALRM at the deadline) in
the main thread. Libraries may wrap it on its way out (DCP's load turns any exception into a
``CheckpointException``), so the guard also remembers what arrived: whatever exception the
drill ends with, an interrupt that arrived is what ended it. A second signal while the drill
records itself is noted and ignored; a third exits at once.

The deadline bounds every phase: a read stuck on a hung mount, a FIFO that slipped past the
checks, a storage that never answers — the main thread is woken and the drill ends as
``error`` with the phase it was in. Threads stuck in a system call are left behind.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """A signal asked the drill to stop (a ``BaseException``: no ``except Exception`` eats it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


class TimedOut(BaseException):
    """The drill ran past its deadline."""


def arm(seconds: float) -> None:
    """SIGALRM in ``seconds`` (bounded: :func:`~drill.units.bounded_wait`): the one way drill
    sets its timer."""
    from drill.units import bounded_wait

    signal.setitimer(signal.ITIMER_REAL, bounded_wait(seconds))


class InterruptGuard:
    """Install the handlers for the duration of a drill (main thread only; elsewhere the
    caller's own handling applies). ``timeout``: seconds before :class:`TimedOut`."""

    def __init__(self, timeout: float | None = None) -> None:
        self.signum: int | None = None
        self.timeout = timeout
        self.timed_out = False
        self._count = 0
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._count += 1
        if self._count == 1:
            self.signum = signum
            raise Interrupted(signum)
        if self._count >= 3:
            os._exit(128 + signum)  # the user insists: no record is worth a hung terminal

    def _alarm(self, signum: int, frame: FrameType | None) -> None:
        if self._count == 0 and not self.timed_out:
            self.timed_out = True
            raise TimedOut(f"ran past its {self.timeout:g} s timeout")

    def quiet(self) -> None:
        """From now on signals only count (the drill is recording its end)."""
        self._count = max(self._count, 1)
        if self.timeout and threading.current_thread() is threading.main_thread():
            signal.setitimer(signal.ITIMER_REAL, 0)

    def __enter__(self) -> InterruptGuard:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
            if self.timeout:
                self._previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, self._alarm)
                arm(self.timeout)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if signal.SIGALRM in self._previous:
            signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


@contextmanager
def held_off() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block is done (then arrive as usual): for work that must
    not stop half-way — a database's schema being created or migrated, which a signal between
    two statements would leave neither old nor new. Main thread only; elsewhere a no-op.

    The handlers are swapped, not the signal mask: a process-directed signal reaches whichever
    thread does not block it — a distributed drill's heartbeat thread — and Python then runs the
    handler in the main thread all the same; a handler that only notes the signal holds it off
    whatever thread took it. The first signal noted is raised again after the block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        noted.append(signum)

    previous = {sig: signal.signal(sig, note) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if noted:
            signal.raise_signal(noted[0])


@contextmanager
def deadline(seconds: float | None, what: str) -> Iterator[None]:
    """Raise :class:`~drill.errors.DrillError` (exit 5) if the block runs past ``seconds``.
    Deadlines nest: an inner one never extends an outer one (a command's ``--timeout`` bounds
    the listing inside it too), and the outer one's clock runs on after the inner one ends."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return
    from drill.errors import DrillError

    outer = signal.getitimer(signal.ITIMER_REAL)[0]
    if 0 < outer <= seconds:
        yield  # the outer deadline comes first: it is the one that fires
        return

    def alarm(signum: int, frame: FrameType | None) -> None:
        raise TimedOut(what)

    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, alarm)
    arm(seconds)
    try:
        yield
    except TimedOut:
        raise DrillError(
            f"{what} ran past its {seconds:g} s timeout (a hung mount, or storage that never answers)"
        ) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer > 0:  # the outer deadline's clock, less what this one took
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, outer - (time.monotonic() - started)))
