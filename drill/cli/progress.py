"""Progress on stderr for a drill: bars on a terminal, one line per phase in a log.

On a terminal: the phase, and for phases that move bytes (``read``) a bar with bytes and
throughput. Elsewhere (a batch job's log, ``2>file``): one timestamped line per phase, so a
long drill is never silent. ``--quiet`` turns both off.
"""

from __future__ import annotations

import threading
import time

from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)

from drill.cli.common import stderr
from drill.units import human_bytes

_WHAT = {
    "discover": "listing the run and choosing the checkpoint",
    "plan": "reading the checkpoint's manifests",
    "restore": "restoring onto the device",
    "read": "reading and hashing",
    "checks": "checking the restored state",
    "replay": "replaying training steps",
}


class RichProgress:
    def __init__(self, *, quiet: bool = False) -> None:
        self._console = stderr().rich
        self._tty = self._console.is_terminal
        self._quiet = quiet
        self._started = time.monotonic()
        self._bytes = Progress(
            TextColumn("[bold]{task.description:<9}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeElapsedColumn(),
            console=self._console,
            transient=True,
            disable=quiet or not self._tty,
        )
        self._task: TaskID | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> RichProgress:
        self._bytes.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bytes.stop()

    def phase(self, name: str, total_bytes: int | None = None) -> None:
        with self._lock:
            if self._task is not None:
                self._bytes.update(self._task, visible=False)
            self._task = None
            if self._tty and total_bytes:
                self._task = self._bytes.add_task(name, total=total_bytes)
            elif self._tty and not self._quiet:  # phases that move no bytes get a line, not a "0/? bytes" bar
                self._bytes.console.print(f"[dim]{name}: {_WHAT.get(name, name)}[/]")
            elif not self._quiet:
                size = f" ({human_bytes(total_bytes)})" if total_bytes else ""
                self._console.print(
                    f"drill: +{time.monotonic() - self._started:6.1f}s {name}: {_WHAT.get(name, name)}{size}",
                    markup=False,
                    highlight=False,
                )

    def advance(self, nbytes: int) -> None:
        with self._lock:
            if self._task is not None:
                self._bytes.advance(self._task, nbytes)
