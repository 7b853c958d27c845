"""SIGINT and SIGTERM during a drill: stop at once, wherever the drill is, and say so once.

A handler raises :class:`Interrupted` in the main thread. Libraries may wrap it on its way
out (DCP's load turns any exception into a ``CheckpointException``), so the guard also
remembers the signal: whatever exception the drill ends with, an interrupt that arrived is
what ended it. A second signal while the drill records itself is noted and ignored; a third
exits at once.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType, TracebackType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """A signal asked the drill to stop (a ``BaseException``: no ``except Exception`` eats it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


class InterruptGuard:
    """Install the handlers for the duration of a drill (main thread only; elsewhere the
    caller's own handling applies)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._count = 0
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._count += 1
        if self._count == 1:
            self.signum = signum
            raise Interrupted(signum)
        if self._count >= 3:
            os._exit(128 + signum)  # the user insists: no record is worth a hung terminal

    def quiet(self) -> None:
        """From now on signals only count (the drill is recording its end)."""
        self._count = max(self._count, 1)

    def __enter__(self) -> InterruptGuard:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
