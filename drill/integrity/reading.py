"""Reading a file's bytes exactly once, hashed on the way in.

Torch-free, so ``drill verify`` and ``drill seal`` use it without importing torch. A file that
changes size while it is read (truncated by a re-save, appended to) is an ``EOFError``, which
the checks report as ``file-changed``; transient I/O errors (EIO on a flaky mount, ESTALE on
NFS) are retried a bounded number of times before the file counts as unreadable.
"""

from __future__ import annotations

import errno
import mmap
import time
from collections.abc import Callable
from dataclasses import dataclass

from drill.integrity.hashing import DEFAULT_CHUNK_SIZE, ChunkHasher, FileHashes
from drill.storage import NotARegularFile, PathEscapesCheckpoint, Storage

READ_CHUNK = 8 << 20
"""Bytes per read call: large enough to stream at page-cache speed."""

TRANSIENT = frozenset({errno.EIO, errno.EAGAIN, errno.EINTR, errno.ETIMEDOUT, errno.ESTALE, errno.ECONNRESET})
ATTEMPTS = 3
"""Reads of one file before a transient error counts: the first and two retries."""


class FileChanged(EOFError):
    """The file's size changed between the listing and the end of the read."""


@dataclass(slots=True)
class ReadResult:
    view: memoryview
    hashes: FileHashes | None
    retries: int = 0


def read_whole(
    storage: Storage,
    uri: str,
    size: int,
    on_bytes: Callable[[int], None] = lambda n: None,
    *,
    hash: bool = True,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    sha256: bool = False,
) -> ReadResult:
    """Every byte of ``uri`` in one page-aligned buffer (an anonymous ``mmap``: a ``bytearray``
    starts mid-page and reads ~3x slower), with its chunk digests when ``hash``."""
    retries = 0
    while True:
        try:
            view, hashes = _read_once(storage, uri, size, on_bytes, hash=hash, chunk_size=chunk_size, sha256=sha256)
            return ReadResult(view, hashes, retries)
        except OSError as exc:
            if exc.errno not in TRANSIENT or retries + 1 >= ATTEMPTS:
                raise
            retries += 1
            time.sleep(0.05 * 2**retries)


def _read_once(
    storage: Storage, uri: str, size: int, on_bytes: Callable[[int], None], *, hash: bool, chunk_size: int, sha256: bool
) -> tuple[memoryview, FileHashes | None]:
    hasher = ChunkHasher(chunk_size, sha256) if hash else None
    view = memoryview(mmap.mmap(-1, size) if size else bytearray())
    pos = 0
    with storage.open(uri) as f:
        while pos < size:
            n = f.readinto(view[pos : pos + READ_CHUNK])
            if not n:
                break
            if hasher is not None:
                hasher.update(view[pos : pos + n])
            pos += n
            on_bytes(n)
        extra = f.read(1)
    if pos < size:
        raise FileChanged(f"file shrank while it was read: {pos} of the {size} bytes it had when listed")
    if extra:
        raise FileChanged(f"file grew while it was read: more than the {size} bytes it had when listed")
    return view, hasher.finish() if hasher is not None else None


def hash_stream(
    storage: Storage,
    uri: str,
    size: int | None = None,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    sha256: bool = False,
    on_bytes: Callable[[int], None] = lambda n: None,
) -> FileHashes:
    """Hash a file through one reused buffer (verify and seal need its digests, not its bytes).

    When ``size`` is given, a file that is not that size by the end of the read raises
    :class:`FileChanged`.
    """
    hasher = ChunkHasher(chunk_size, sha256)
    buf = memoryview(mmap.mmap(-1, READ_CHUNK))
    with storage.open(uri) as f:
        while n := f.readinto(buf):
            hasher.update(buf[:n])
            on_bytes(n)
    result = hasher.finish()
    if size is not None and result.size != size:
        raise FileChanged(f"file is {result.size} bytes by the end of the read, {size} when listed")
    return result


def describe_read_error(exc: BaseException) -> tuple[str, str]:
    """(message, kind) for a file that could not be read: kind is ``missing``, ``escapes``,
    ``not-regular``, ``changed`` or ``unreadable``, as the ``files`` check reports it."""
    if isinstance(exc, PathEscapesCheckpoint):
        return str(exc), "escapes"
    if isinstance(exc, NotARegularFile):
        return "not a regular file (a FIFO, socket or device)", "not-regular"
    if isinstance(exc, FileNotFoundError):
        return "no such file", "missing"
    if isinstance(exc, IsADirectoryError):
        return "is a directory, not a file", "unreadable"
    if isinstance(exc, EOFError):
        return str(exc), "changed"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc), "unreadable"
    return f"{type(exc).__name__}: {exc}".splitlines()[0], "unreadable"
