"""Sealed at save: a DCP storage writer that hashes every byte as it is written.

:class:`SealingWriter` is DCP's :class:`~torch.distributed.checkpoint.FileSystemWriter` with
its file system wrapped: every stream a rank writes feeds a :class:`ChunkHasher` — the same
16 MiB xxh3-128 chunks as ``drill seal`` — on the thread that writes it (DCP's I/O threads;
for ``async_save``, its background persist thread, never the training thread). Each rank
hands its files' digests to the coordinator with its write results; in DCP's ``finish`` the
coordinator writes ``.metadata`` to its temporary name (hashing it too), then
``drill-manifest.json`` (keyed with the seal key when one is given), then commits
``.metadata`` by renaming it. So a checkpoint whose ``.metadata`` is committed is always
sealed; a save interrupted before ``finish`` leaves neither; and nothing is read back —
``drill verify``, ``drill run`` and ``drill.sdk.load`` read the manifest as if ``drill seal``
had written it, with identical digests.

What the seal cost is kept on the writer (:attr:`SealingWriter.report`): bytes, files,
seconds spent hashing summed over every rank's threads, the save's wall time.
"""

from __future__ import annotations

import io
import os
import queue
import threading
import time
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.storage import WriteResult

from drill.failpoints import failpoint
from drill.integrity.hashing import DEFAULT_CHUNK_SIZE, ChunkHasher, FileHashes
from drill.integrity.manifest import MANIFEST_NAME, FileEntry, Manifest, frameworks, key_id

METADATA = ".metadata"
_SEAL_FQN = "__drill_seal__"
"""The write result each rank adds to carry its digests to the coordinator (removed again
before DCP's ``finish`` builds ``.metadata``)."""


@dataclass(slots=True)
class SealReport:
    """What sealing one save cost."""

    files: int = 0
    bytes: int = 0
    hash_seconds: float = 0.0
    """Summed over every rank's writing threads (they hash in parallel)."""
    save_seconds: float = 0.0
    """The coordinator's wall time from its first write to the committed ``.metadata``."""
    bytes_read_back: int = 0
    """Bytes the seal had to read again (a stream written out of order): 0 for DCP's writers."""
    manifest: str | None = None
    keyed: bool = False
    recorder: Any = None
    """The background thread recording this save in the database, when one is (join it to wait)."""


@dataclass(slots=True)
class _RankDigests:
    files: dict[str, FileHashes] = field(default_factory=dict)
    hash_seconds: float = 0.0
    bytes_read_back: int = 0
    started: float = 0.0


class _HashingStream(io.RawIOBase):
    """A file being written: every byte goes to the file and, in order, to the hasher — on a
    thread of its own, so hashing a piece overlaps writing the next (xxhash releases the GIL).
    Small writes are copied (the writer may reuse its buffer); large ones — tensor storage that
    lives until the file is done — are hashed in place. ``close`` waits for the hasher."""

    COPY_BELOW = 4 << 20

    def __init__(self, raw: Any, hasher: ChunkHasher) -> None:
        super().__init__()
        self.raw, self.hasher = raw, hasher
        self.position = 0
        self.hash_seconds = 0.0
        self.out_of_order = False
        self._pieces: queue.Queue[Any] = queue.Queue(maxsize=64)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._hash, name="drill-seal-hash", daemon=True)
        self._thread.start()

    def _hash(self) -> None:
        while (piece := self._pieces.get()) is not None:
            if self._error is None and not self.out_of_order:
                started = time.perf_counter()
                try:
                    self.hasher.update(piece)
                except BaseException as exc:  # noqa: BLE001 - handed to the writing thread at close
                    self._error = exc
                self.hash_seconds += time.perf_counter() - started
            if isinstance(piece, memoryview):
                piece.release()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        written = self.raw.write(view)
        written = len(view) if written is None else written
        if not self.out_of_order:
            piece = view[:written]
            self._pieces.put(bytes(piece) if written < self.COPY_BELOW else piece)
        self.position += written
        return written

    def tell(self) -> int:
        return self.raw.tell()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        where = self.raw.seek(offset, whence)
        if where != self.position:
            self.out_of_order = True  # hashed again from the file once written (never for DCP's writers)
        return where

    def flush(self) -> None:
        self.raw.flush()

    def fileno(self) -> int:
        return self.raw.fileno()

    def close(self) -> None:
        if not self.closed:
            self._pieces.put(None)
            self._thread.join()
            self.raw.flush()
            if self._error is not None:
                raise self._error
        super().close()


class _SealingFileSystem(FileSystem):
    """DCP's local file system, hashing what it writes and sealing just before the commit."""

    def __init__(self, chunk_size: int) -> None:
        super().__init__()
        self.chunk_size = chunk_size
        self.digests = _RankDigests()
        self.lock = threading.Lock()
        self.before_commit: Any = None

    def __getstate__(self) -> dict[str, Any]:  # DCP's process-based async save pickles the writer
        return {"chunk_size": self.chunk_size}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["chunk_size"])  # type: ignore[misc]

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        if "w" not in mode:
            with super().create_stream(path, mode) as raw:
                yield raw
            return
        with super().create_stream(path, mode) as raw:
            stream = _HashingStream(raw, ChunkHasher(self.chunk_size))
            yield stream  # type: ignore[misc]
            stream.close()
        self._keep(Path(path), stream)

    def _keep(self, path: Path, stream: _HashingStream) -> None:
        failpoint("sealed-file")
        hashes, read_back = stream.hasher.finish(), 0
        if stream.out_of_order:
            hashes = _hash_file(path, self.chunk_size)
            read_back = hashes.size
        with self.lock:
            self.digests.files[path.name] = hashes
            self.digests.hash_seconds += stream.hash_seconds
            self.digests.bytes_read_back += read_back

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        old, new = Path(path), Path(new_path)
        with self.lock:
            if old.name in self.digests.files:
                self.digests.files[new.name] = self.digests.files.pop(old.name)
        if new.name == METADATA and self.before_commit is not None:
            self.before_commit()  # the seal is on disk before the checkpoint is committed
        super().rename(path, new_path)


def _hash_file(path: Path, chunk_size: int) -> FileHashes:
    hasher = ChunkHasher(chunk_size)
    with open(path, "rb") as f:
        while piece := f.read(chunk_size):
            hasher.update(piece)
    return hasher.finish()


class SealingWriter(FileSystemWriter):
    """``FileSystemWriter`` that seals the checkpoint as it writes it (see the module).

    ``key``: the seal key (bytes, see :func:`drill.integrity.keys.load_key`) for a keyed seal.
    Every other argument is ``FileSystemWriter``'s."""

    def __init__(self, path: str | os.PathLike, *args: Any, key: bytes | None = None, chunk_size: int = DEFAULT_CHUNK_SIZE, **kwargs: Any) -> None:
        super().__init__(path, *args, **kwargs)
        self.fs = _SealingFileSystem(chunk_size)
        self.key = key
        self.report = SealReport()

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        super().reset(checkpoint_id)
        self.fs.digests = _RankDigests(started=time.perf_counter())
        self.report = SealReport()

    def write_data(self, plan: Any, planner: Any) -> Any:
        if not self.fs.digests.started:
            self.fs.digests.started = time.perf_counter()
        future = super().write_data(plan, planner)
        results = list(future.value())
        with self.fs.lock:
            mine = self.fs.digests
            self.fs.digests = _RankDigests(started=mine.started)  # from here on: .metadata, on the coordinator
        results.append(WriteResult(index=MetadataIndex(_SEAL_FQN), size_in_bytes=0, storage_data=mine))
        future = type(future)()
        future.set_result(results)
        return future

    def finish(self, metadata: Any, results: list[list[WriteResult]]) -> None:
        ranks = [wr.storage_data for rank in results for wr in rank if wr.index.fqn == _SEAL_FQN]
        clean = [[wr for wr in rank if wr.index.fqn != _SEAL_FQN] for rank in results]
        files: dict[str, FileHashes] = {}
        for digests in ranks:
            files.update(digests.files)
        report = self.report
        report.hash_seconds = sum(d.hash_seconds for d in ranks)
        report.bytes_read_back = sum(d.bytes_read_back for d in ranks)
        started = self.fs.digests.started or time.perf_counter()

        def seal_now() -> None:
            with self.fs.lock:
                files.update(self.fs.digests.files)  # .metadata, written by this coordinator
            report.manifest = write_manifest(Path(self.path), files, self.key, self.fs.chunk_size)
            report.files, report.bytes, report.keyed = len(files), sum(h.size for h in files.values()), self.key is not None

        self.fs.before_commit = seal_now
        try:
            super().finish(metadata, clean)
        finally:
            self.fs.before_commit = None
        report.hash_seconds += self.fs.digests.hash_seconds
        report.save_seconds = time.perf_counter() - started


def write_manifest(checkpoint: Path, files: dict[str, FileHashes], key: bytes | None, chunk_size: int) -> str:
    """``drill-manifest.json``, atomically (a temporary name drill's listings skip, then a rename)."""
    from drill.checkpoints import step_of

    entries = [FileEntry(name, h.size, h.digest, tuple(h.chunk_hex)) for name, h in sorted(files.items())]
    manifest = Manifest(step=step_of(checkpoint.name), chunk_size=chunk_size, files=entries, frameworks=frameworks())
    manifest.key_id = key_id(key) if key is not None else None
    target = checkpoint / MANIFEST_NAME
    tmp = checkpoint / f".{MANIFEST_NAME}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(manifest.to_json(key))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    directory = os.open(checkpoint, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself is durable before .metadata commits the checkpoint
    finally:
        os.close(directory)
    return str(target)


__all__ = ["SealReport", "SealingWriter", "write_manifest"]
