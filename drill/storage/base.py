"""The storage contract every backend implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Protocol


class StorageError(OSError):
    """A storage operation failed; the message names the URI."""


class PathEscapesCheckpoint(StorageError):
    """A relative path would leave the checkpoint (``..``, absolute, or a symlink leading out)."""


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    """Last component of the URI."""
    uri: str
    is_dir: bool
    size: int
    mtime: float
    """Seconds since the epoch (UTC)."""


class Storage(Protocol):
    def list(self, uri: str) -> list[Entry]:
        """Entries directly under the directory/prefix ``uri``, sorted by name."""
        ...

    def stat(self, uri: str) -> Entry:
        """The entry at ``uri``; raises ``FileNotFoundError`` when absent."""
        ...

    def open(self, uri: str) -> BinaryIO:
        """A binary stream reading ``uri`` from its first byte."""
        ...

    def map(self, uri: str) -> memoryview | None:
        """The whole object as a read-only memory map, or ``None`` where the backend cannot
        map (object storage): the caller then reads it with :meth:`open`."""
        ...

    def child(self, base: str, relative: str) -> str:
        """The URI of ``relative`` inside ``base``; raises :class:`PathEscapesCheckpoint` when it
        would resolve outside ``base``."""
        ...
