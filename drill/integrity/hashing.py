"""Hashing file bytes in fixed-size chunks, so a mismatch can be located to a byte range.

A file's digest is xxh3-128 over the concatenation of its chunk digests: one pass over the
data yields both, and chunk digests let a verifier name the damaged range.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import xxhash

DEFAULT_CHUNK_SIZE = 16 << 20
"""16 MiB: large enough to hash at memory speed, small enough to locate damage usefully."""


@dataclass(slots=True)
class FileHashes:
    size: int
    chunk_size: int
    chunks: list[bytes] = field(default_factory=list)
    """Raw 16-byte xxh3-128 digests of each chunk."""
    sha256: str | None = None
    """Only when a foreign manifest (Megatron's integrity.json) needs it."""

    @property
    def digest(self) -> str:
        return file_digest(self.chunks)

    @property
    def chunk_hex(self) -> list[str]:
        return [c.hex() for c in self.chunks]


def file_digest(chunks: list[bytes]) -> str:
    return xxhash.xxh3_128_hexdigest(b"".join(chunks))


class ChunkHasher:
    """Feed bytes in any split; chunk digests come out on ``chunk_size`` boundaries."""

    def __init__(self, chunk_size: int = DEFAULT_CHUNK_SIZE, sha256: bool = False) -> None:
        self.result = FileHashes(size=0, chunk_size=chunk_size)
        self._chunk = xxhash.xxh3_128()
        self._filled = 0
        self._sha = hashlib.sha256() if sha256 else None

    def update(self, data: memoryview | bytes) -> None:
        view = memoryview(data).cast("B")
        size = self.result.chunk_size
        if self._sha is not None:
            self._sha.update(view)
        self.result.size += len(view)
        while len(view):
            take = min(size - self._filled, len(view))
            self._chunk.update(view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == size:
                self.result.chunks.append(self._chunk.digest())
                self._chunk.reset()
                self._filled = 0

    def finish(self) -> FileHashes:
        if self._filled or not self.result.chunks:
            self.result.chunks.append(self._chunk.digest())
            self._filled = 0
        if self._sha is not None:
            self.result.sha256 = self._sha.hexdigest()
        return self.result


def hash_view(view: memoryview, chunk_size: int = DEFAULT_CHUNK_SIZE, sha256: bool = False, on_bytes=None) -> FileHashes:  # type: ignore[no-untyped-def]
    """Hash a whole in-memory (or memory-mapped) file, reporting progress per chunk."""
    hasher = ChunkHasher(chunk_size, sha256)
    for pos in range(0, len(view), chunk_size):
        piece = view[pos : pos + chunk_size]
        hasher.update(piece)
        if on_bytes is not None:
            on_bytes(len(piece))
    return hasher.finish()
