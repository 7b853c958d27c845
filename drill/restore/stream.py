"""Reading a file's bytes exactly once — hashed on the way — and streaming slices of them.

Torch-free, so ``drill verify`` and ``drill seal`` can use it without importing torch.
"""

from __future__ import annotations

import io
import mmap
from collections.abc import Callable

from drill.integrity.hashing import DEFAULT_CHUNK_SIZE, ChunkHasher, FileHashes, hash_view
from drill.storage import PathEscapesCheckpoint, Storage

READ_CHUNK = 8 << 20
"""Read size for backends that cannot map: large enough to stream at page-cache speed."""


def read_whole(
    storage: Storage,
    uri: str,
    size: int,
    on_bytes: Callable[[int], None],
    *,
    hash: bool = True,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    sha256: bool = False,
) -> tuple[memoryview, FileHashes | None]:
    """Every byte of ``uri``, read exactly once, with its chunk digests when ``hash``.

    Where the storage can map the file, the bytes are hashed straight from the page cache and
    later deserialized from the same mapping — no copy into a buffer, so verification rides
    the read a restore needs anyway. Otherwise they are read into one page-aligned buffer (an
    anonymous ``mmap``; a ``bytearray`` starts mid-page and reads ~3x slower) and hashed per
    chunk as they arrive. xxhash releases the GIL, so files hash in parallel on reader threads.
    """
    mapped = storage.map(uri)
    if mapped is not None:
        if len(mapped) != size:
            raise EOFError(f"file changed size while it was opened: {len(mapped)} bytes, {size} when listed")
        if not hash:
            on_bytes(size)
            return mapped, None
        return mapped, hash_view(mapped, chunk_size, sha256=sha256, on_bytes=on_bytes)
    hasher = ChunkHasher(chunk_size, sha256) if hash else None
    buf = mmap.mmap(-1, size) if size else bytearray()
    view = memoryview(buf)
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
        raise EOFError(f"file shrank while reading: {pos} of {size} bytes")
    if extra:
        raise EOFError(f"file grew while reading: more than {size} bytes")
    return view, hasher.finish() if hasher is not None else None


class ViewReader(io.RawIOBase):
    """A seekable stream over a slice of a file buffer, without copying it.

    ``torch.load`` and ``zipfile`` read through ``readinto``, so bytes go straight from the
    file buffer into their destination (``BytesIO(view.tobytes())`` would copy them twice).
    """

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[no-untyped-def, override]
        n = max(0, min(len(b), len(self._view) - self._pos))
        memoryview(b).cast("B")[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos


def describe_read_error(exc: BaseException) -> tuple[str, str]:
    """(message, kind) for a file that could not be read: kind is ``missing``, ``escapes``,
    ``short-read`` or ``unreadable``, as the ``files`` check reports it."""
    if isinstance(exc, PathEscapesCheckpoint):
        return str(exc), "escapes"
    if isinstance(exc, FileNotFoundError):
        return "no such file", "missing"
    if isinstance(exc, EOFError):
        return str(exc), "short-read"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc), "unreadable"
    return f"{type(exc).__name__}: {exc}".splitlines()[0], "unreadable"
