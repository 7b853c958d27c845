"""The storage contract every backend implements: URIs as ``str``, five operations."""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple, Protocol


class StorageError(OSError):
    """A storage operation failed; the message names the URI."""


class PathEscapesCheckpoint(StorageError):
    """A relative path would leave the checkpoint (``..``, absolute, or a symlink leading out)."""


class StorageUnavailable(StorageError):
    """The storage kept failing (an endpoint away, 5xx or resets past every retry): a fault of
    the infrastructure, not of the checkpoint."""


class FileChanged(EOFError):
    """A file's size or content changed between its listing and the end of its read."""


class NotARegularFile(StorageError):
    """A FIFO, socket or device where a file should be: never opened (opening a FIFO blocks)."""


class EntryKind(str, Enum):
    FILE = "file"
    DIR = "dir"
    DANGLING = "dangling"
    """A symlink whose target does not exist."""
    LOOP = "loop"
    """A symlink that cannot be resolved (it leads back into itself, or through too many links)."""
    OTHER = "other"
    """A FIFO, socket or device node: not checkpoint data, and never opened."""


class Entry(NamedTuple):
    """One entry of a listing (a tuple: a directory of 20,000 shards makes 20,000 of them)."""

    name: str
    """Last component of the URI."""
    uri: str
    kind: EntryKind
    size: int
    mtime: float
    """Seconds since the epoch (UTC)."""
    link_target: str | None = None
    """Where a symlink points, as written in the link (local filesystems only)."""

    @property
    def is_dir(self) -> bool:
        return self.kind is EntryKind.DIR

    @property
    def is_file(self) -> bool:
        return self.kind is EntryKind.FILE


@dataclass(frozen=True, slots=True)
class CacheState:
    """Where a read of some files will come from: how much of them this host has cached."""

    bytes: int
    resident: int | None
    """Bytes in this host's page cache (None: the storage keeps no local cache)."""
    how: str

    def to_dict(self) -> dict[str, object]:
        return {"bytes": self.bytes, "resident": self.resident, "how": self.how}


class Storage(Protocol):
    positioned_reads: bool
    """Whether many threads may read one file at their own offsets through ``open(uri).fileno()``
    — or a raw descriptor from ``open_fd(uri)``, which such a storage also offers (a local
    filesystem); object storage streams, reading ahead by itself."""

    def list(self, uri: str) -> list[Entry]:
        """Entries directly under the directory/prefix ``uri``, sorted by name."""
        ...

    def stat(self, uri: str) -> Entry:
        """The entry at ``uri`` (following symlinks); raises ``FileNotFoundError`` when absent."""
        ...

    def open(self, uri: str) -> io.RawIOBase:
        """A binary stream reading the regular file ``uri`` from its first byte; raises
        :class:`NotARegularFile` — without blocking — for anything else."""
        ...

    def child(self, base: str, relative: str) -> str:
        """The URI of ``relative`` inside ``base``; raises :class:`PathEscapesCheckpoint` when it
        would resolve outside ``base``."""
        ...

    def open_below(self, base: str, relative: str) -> tuple[io.RawIOBase, int]:
        """:meth:`open` of :meth:`child` and the file's size as opened, in one step: a reader of
        thousands of small files pays one open each (a local file is opened without resolving
        its path first — a link along it is still refused — and sized by its descriptor)."""
        ...

    def write(self, uri: str, data: bytes, *, replace: bool = False) -> None:
        """Write ``data`` to ``uri`` atomically: readers see the old object or the new one,
        never a torn one. Without ``replace``, raises ``FileExistsError`` if ``uri`` exists."""
        ...

    def normalize(self, uri: str) -> str:
        """The canonical spelling of ``uri`` that records key on (an absolute path locally)."""
        ...

    def cached(self, sizes: Mapping[str, int]) -> CacheState:
        """How much of these files (URI → size, as listed) this host holds cached: a read of
        them is that warm. Nothing is read, and nothing is asked of a remote store."""
        ...

    def evict(self, sizes: Mapping[str, int]) -> CacheState:
        """Drop what this host caches of these files, so the next read comes from the storage
        itself (a cold read, as a restart's); returns what is still cached after."""
        ...
