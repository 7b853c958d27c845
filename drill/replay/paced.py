"""A replay target for a framework that runs its own training loop (the Hugging Face
``Trainer``, Lightning's ``Trainer``): the framework resumes from the checkpoint with its own
code, in a thread, and a callback of it hands drill one step at a time.

The framework's loop runs in a daemon thread. Its callbacks call :meth:`PacedReplay.restored`
once everything is loaded and :meth:`PacedReplay.stepped` after each optimizer step; each
waits there until drill asks for the next step (:meth:`PacedReplay.step`), so the loop never
runs ahead of the replay, and the replay process exits when drill has its K steps.
"""

from __future__ import annotations

import queue
import threading
from abc import ABC, abstractmethod
from typing import Any


class PacedReplay(ABC):
    """Subclasses write :meth:`run`: the framework's resume from ``self.checkpoint``."""

    def __init__(self) -> None:
        self.checkpoint: str | None = None
        self._out: queue.Queue[Any] = queue.Queue()
        self._go = threading.Semaphore(0)

    @abstractmethod
    def run(self) -> None:
        """The framework's own resume from ``self.checkpoint``, run to its end (in the loop's thread)."""

    # -- drill's side (the replay's main thread) -------------------------------------------
    def restore(self, checkpoint: str) -> None:
        """Start the framework on the checkpoint; return once it has loaded everything and is
        about to take its first step."""
        self.checkpoint = checkpoint
        threading.Thread(target=self._loop, name="drill-paced-replay", daemon=True).start()
        self._next("restoring")

    def step(self) -> dict[str, Any]:
        self._go.release()
        return self._next("replaying")

    # -- the framework's side (its callbacks, in the loop's thread) ------------------------
    def restored(self) -> None:
        self._out.put("restored")
        self._go.acquire()

    def stepped(self, record: dict[str, Any]) -> None:
        self._out.put(record)
        self._go.acquire()

    def _loop(self) -> None:
        try:
            self.run()
            self._out.put(StopIteration("the framework's loop ended (its max_steps or max_epochs)"))
        except BaseException as exc:  # noqa: BLE001 - handed to the replay's main thread, which raises it
            self._out.put(exc)

    def _next(self, doing: str) -> Any:
        got = self._out.get()
        if isinstance(got, StopIteration):
            raise RuntimeError(f"{got} while {doing}")
        if isinstance(got, BaseException):
            raise got
        return got


__all__ = ["PacedReplay"]
