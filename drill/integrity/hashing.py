"""Hashing file bytes in fixed-size chunks, so a mismatch can be located to a byte range.

A file's digest is xxh3-128 over the concatenation of its chunk digests: one pass over the
data yields both, and chunk digests let a verifier name the damaged range.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash

try:  # ISA-L's CRC-32 (carry-less multiply): ~30 GB/s where zlib's runs at 5
    from isal.isal_zlib import crc32
except ImportError:  # a platform without its wheel: the same CRC, slower
    from zlib import crc32

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
        return list(map(bytes.hex, self.chunks))

    def matches(self, chunks: Sequence[str]) -> bool:
        """Whether these are the chunk digests ``chunks`` (hex, as a manifest records them)."""
        mine = self.chunks
        if len(mine) != len(chunks):
            return False
        if len(mine) == 1:  # a file of one chunk: most files of a checkpoint of many small ones
            return mine[0].hex() == chunks[0]
        return list(map(bytes.hex, mine)) == list(chunks)


class AsSealed:
    """A file of one chunk that was hashed where it was read and found, there, to be exactly
    what its seal says: the sealed size and the sealed digest. A verification's hashing
    workers compare each small file with the seal they were handed (:mod:`drill.integrity.mapped`)
    instead of handing every digest back to be compared; a file that differs comes back with
    its digests, as without a seal. One instance: :data:`AS_SEALED`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "AS_SEALED"


AS_SEALED = AsSealed()


def chunk_count(size: int, chunk_size: int) -> int:
    """How many chunk digests a file of ``size`` bytes has (an empty file: one, of nothing)."""
    return max(1, -(-size // chunk_size))


def file_digest(chunks: list[bytes]) -> str:
    return xxhash.xxh3_128_hexdigest(b"".join(chunks))


def _sha256() -> Any:
    import hashlib  # OpenSSL's start-up (2 ms) only where a foreign manifest needs SHA-256

    return hashlib.sha256()


class ChunkHasher:
    """Feed bytes in any split; chunk digests come out on ``chunk_size`` boundaries."""

    def __init__(self, chunk_size: int = DEFAULT_CHUNK_SIZE, sha256: bool = False) -> None:
        self.result = FileHashes(size=0, chunk_size=chunk_size)
        self._chunk = xxhash.xxh3_128()
        self._filled = 0
        self._sha = _sha256() if sha256 else None

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


@dataclass(frozen=True, slots=True)
class HashPlan:
    """Which files a read hashes as the bytes arrive, and how."""

    chunk_size: int = DEFAULT_CHUNK_SIZE
    files: frozenset[str] | None = None
    """None: every file (the default); else only these (a sampled drill)."""
    sha256: frozenset[str] = frozenset()
    """Files a foreign manifest lists with SHA-256 digests, hashed with that too."""

    def wants(self, path: str) -> bool:
        return self.files is None or path in self.files

    def under(self, prefix: str) -> HashPlan:
        """The plan for the files below ``prefix`` (``sub/``), named relative to it: for a
        checkpoint nested in another's directory, read by its own format."""

        def strip(paths: frozenset[str]) -> frozenset[str]:
            return frozenset(p[len(prefix) :] for p in paths if p.startswith(prefix))

        return HashPlan(
            chunk_size=self.chunk_size,
            files=None if self.files is None else strip(self.files),
            sha256=strip(self.sha256),
        )


__all__ = ["DEFAULT_CHUNK_SIZE", "ChunkHasher", "FileHashes", "HashPlan", "chunk_count", "crc32", "file_digest"]
