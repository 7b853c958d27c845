"""Rich progress on stderr for a drill: phase, bytes, throughput. Off when stderr is no TTY."""

from __future__ import annotations

import threading

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


class RichProgress:
    def __init__(self, enabled: bool = True) -> None:
        console = stderr()
        self._progress = Progress(
            TextColumn("[bold]{task.description:<9}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=not (enabled and console.is_terminal),
        )
        self._task: TaskID | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def phase(self, name: str, total_bytes: int | None = None) -> None:
        with self._lock:
            if self._task is not None:
                self._progress.update(self._task, visible=False)
            self._task = self._progress.add_task(name, total=total_bytes)

    def advance(self, nbytes: int) -> None:
        with self._lock:
            if self._task is not None:
                self._progress.advance(self._task, nbytes)
