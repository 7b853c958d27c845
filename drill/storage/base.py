"""The storage contract every backend implements: URIs as ``str``, five operations."""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple, Protocol

from drill.errors import UsageError


class StorageError(OSError):
    """A storage operation failed; the message names the URI."""


class Unaddressable(StorageError, UsageError):
    """A location no storage can address as given — an unknown scheme, an ``s3://`` URI
    without a bucket, a bucket name S3 refuses, object-store settings that cannot be used (an
    endpoint that is no URL, a concurrency of 0, a config file that does not parse): what was
    typed or configured, refused before any request (a usage error, exit 2), never the
    storage's fault."""

    def __init__(self, message: str) -> None:
        StorageError.__init__(self, message)
        self.message, self.hint = message, None

    def __str__(self) -> str:
        return self.message


class PathEscapesCheckpoint(StorageError):
    """A relative path would leave the checkpoint (``..``, absolute, or a symlink leading out)."""


class StorageUnavailable(StorageError):
    """The storage kept failing (an endpoint away, 5xx or resets past every retry): a fault of
    the infrastructure, not of the checkpoint."""


class FileChanged(EOFError):
    """A file's size or content changed between its listing and the end of its read."""


class NotARegularFile(StorageError):
    """A FIFO, socket or device where a file should be: never opened (opening a FIFO blocks).
    Its ``strerror`` says why without the path, for a message that names the path itself."""

    def __init__(self, path: str) -> None:
        super().__init__(0, "not a regular file (a FIFO, socket or device): not opened for reading", path)

    def __str__(self) -> str:
        return f"{self.filename} is {self.strerror}"


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


class Listing(list[Entry]):
    """One directory's entries, with their names indexed once: each format asks whether it
    recognizes the directory, and on a checkpoint of 20,000 shards nine formats scanning every
    name with their patterns cost more than the listing. A format asks for the names it could
    own — by name, by suffix, its sub-directories — and scans only those. Built from a storage's
    ``list``; not changed once asked."""

    def __init__(self, entries: Iterable[Entry] = ()) -> None:
        super().__init__(entries)
        self._by_name: dict[str, Entry] | None = None
        self._by_suffix: dict[str, list[Entry]] | None = None
        self._dirs: list[Entry] | None = None

    @classmethod
    def of(cls, entries: Iterable[Entry]) -> Listing:
        """``entries`` as a listing (itself when it is one already: its index is kept)."""
        return entries if isinstance(entries, Listing) else cls(entries)

    def get(self, name: str) -> Entry | None:
        """The entry named ``name``, or None."""
        if self._by_name is None:
            self._by_name = {e[0]: e for e in self}  # e.name, without the property's call
        return self._by_name.get(name)

    def file(self, name: str) -> Entry | None:
        """The regular file named ``name``, or None."""
        entry = self.get(name)
        return entry if entry is not None and entry.is_file else None

    def suffixed(self, *suffixes: str) -> list[Entry]:
        """Entries whose names end in one of ``suffixes`` (each from its last dot: ``".pt"``,
        ``".json"``; ``""`` for names without one), by name."""
        by_suffix = self._index()[0]
        found = [e for s in suffixes for e in by_suffix.get(s, ())]
        return sorted(found, key=_entry_name) if len(suffixes) > 1 else found

    @property
    def dirs(self) -> list[Entry]:
        """The sub-directories."""
        return self._index()[1]

    def _index(self) -> tuple[dict[str, list[Entry]], list[Entry]]:
        """Entries by suffix, and the sub-directories: one pass."""
        if self._by_suffix is None or self._dirs is None:
            by_suffix: dict[str, list[Entry]] = {}
            dirs = []
            directory = EntryKind.DIR
            for e in self:
                name = e[0]
                dot = name.rfind(".")
                suffix = name[dot:] if dot > 0 else ""
                same = by_suffix.get(suffix)
                if same is None:
                    by_suffix[suffix] = [e]
                else:
                    same.append(e)
                if e[2] is directory:
                    dirs.append(e)
            self._by_suffix, self._dirs = by_suffix, dirs
        return self._by_suffix, self._dirs


def _entry_name(e: Entry) -> str:
    return e.name


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
