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
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult

from drill.failpoints import failpoint
from drill.integrity.hashing import DEFAULT_CHUNK_SIZE, ChunkHasher, FileHashes
from drill.integrity.manifest import MANIFEST_NAME, key_id, manifest_of

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
    record: Any = None
    """Where the save's record waits in the spool for delivery to the database (a ``Path``;
    None when it was not recorded)."""


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


class _SealingFileSystem:
    """A DCP file system (local, or any other — s3torchconnector's S3 one) wrapped: what it
    writes is hashed, and the seal is written through it just before the commit."""

    def __init__(self, inner: Any, chunk_size: int) -> None:
        self.inner = inner
        self.chunk_size = chunk_size
        self.digests = _RankDigests()
        self.lock = threading.Lock()
        self.before_commit: Any = None

    def __getstate__(self) -> dict[str, Any]:  # DCP's process-based async save pickles the writer
        return {"inner": self.inner, "chunk_size": self.chunk_size}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["inner"], state["chunk_size"])  # type: ignore[misc]

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)  # concat_path, init_path, mkdir, exists, rm_file, …

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        if "w" not in mode:
            with self.inner.create_stream(path, mode) as raw:
                yield raw
            return
        with self.inner.create_stream(path, mode) as raw:
            stream = _HashingStream(raw, ChunkHasher(self.chunk_size))
            yield stream
            stream.close()
        self._keep(path, stream)

    def _keep(self, path: str | os.PathLike, stream: _HashingStream) -> None:
        failpoint("sealed-file")
        hashes, read_back = stream.hasher.finish(), 0
        if stream.out_of_order:
            hashes = self._hash_file(path)
            read_back = hashes.size
        with self.lock:
            self.digests.files[_name(path)] = hashes
            self.digests.hash_seconds += stream.hash_seconds
            self.digests.bytes_read_back += read_back

    def _hash_file(self, path: str | os.PathLike) -> FileHashes:
        hasher = ChunkHasher(self.chunk_size)
        with self.inner.create_stream(path, "rb") as f:
            while piece := f.read(self.chunk_size):
                hasher.update(piece)
        return hasher.finish()

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        old, new = _name(path), _name(new_path)
        with self.lock:
            if old in self.digests.files:
                self.digests.files[new] = self.digests.files.pop(old)
        if new == METADATA and self.before_commit is not None:
            self.before_commit()  # the seal is on storage before the checkpoint is committed
        self.inner.rename(path, new_path)

    def write_manifest(self, checkpoint: str | os.PathLike, files: dict[str, FileHashes], key: bytes | None) -> str:
        """``drill-manifest.json`` through the wrapped file system, atomically where it can be
        (a temporary name drill's listings skip, fsynced, renamed, the directory fsynced)."""
        data = manifest_bytes(_name(checkpoint), files, key, self.chunk_size)
        tmp = self.inner.concat_path(checkpoint, f".{MANIFEST_NAME}.{os.getpid()}.tmp")
        target = self.inner.concat_path(checkpoint, MANIFEST_NAME)
        with self.inner.create_stream(tmp, "wb") as f:
            f.write(data)
            try:
                f.flush()
                os.fsync(f.fileno())
            except (AttributeError, OSError, io.UnsupportedOperation):
                pass  # an object store: the upload completes when the stream closes
        if self.inner.exists(target):
            self.inner.rm_file(target)
        self.inner.rename(tmp, target)
        if os.path.isdir(os.fspath(checkpoint)):
            directory = os.open(os.fspath(checkpoint), os.O_RDONLY)
            try:
                os.fsync(directory)  # the rename itself is durable before .metadata commits the checkpoint
            finally:
                os.close(directory)
        return str(target)


def _name(path: str | os.PathLike) -> str:
    return os.fspath(path).rstrip("/").rsplit("/", 1)[-1]


class _Sealing:
    """What makes a ``FileSystemWriter`` (or a subclass: s3torchconnector's ``S3StorageWriter``)
    seal as it writes: its file system wrapped, its digests carried to the coordinator, the
    manifest written before ``.metadata`` commits."""

    fs: Any
    path: Any
    key: bytes | None
    report: SealReport

    def _init_sealing(self, key: bytes | None, chunk_size: int) -> None:
        self.fs = _SealingFileSystem(self.fs, chunk_size)
        self.key = key
        self.report = SealReport()

    def _base_reset(self, checkpoint_id: Any) -> None: ...
    def _base_write_data(self, plan: Any, planner: Any) -> Any: ...
    def _base_finish(self, metadata: Any, results: Any) -> None: ...

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        self._base_reset(checkpoint_id)
        self.fs.digests = _RankDigests(started=time.perf_counter())
        self.report = SealReport()

    def write_data(self, plan: Any, planner: Any) -> Any:
        if not self.fs.digests.started:
            self.fs.digests.started = time.perf_counter()
        future = self._base_write_data(plan, planner)
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
            report.manifest = self.fs.write_manifest(self.path, files, self.key)
            report.files, report.bytes, report.keyed = (
                len(files),
                sum(h.size for h in files.values()),
                self.key is not None,
            )

        self.fs.before_commit = seal_now
        try:
            self._base_finish(metadata, clean)
        finally:
            self.fs.before_commit = None
        report.hash_seconds += self.fs.digests.hash_seconds
        report.save_seconds = time.perf_counter() - started


class SealingWriter(_Sealing, FileSystemWriter):
    """``FileSystemWriter`` that seals the checkpoint as it writes it (see the module).

    ``key``: the seal key (bytes, see :func:`drill.integrity.keys.load_key`) for a keyed seal.
    Every other argument is ``FileSystemWriter``'s."""

    def __init__(
        self,
        path: str | os.PathLike,
        *args: Any,
        key: bytes | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        **kwargs: Any,
    ) -> None:
        super().__init__(path, *args, **kwargs)
        self._init_sealing(key, chunk_size)

    _base_reset = FileSystemWriter.reset
    _base_write_data = FileSystemWriter.write_data
    _base_finish = FileSystemWriter.finish
    _step: int | None = None

    def prepare_global_plan(self, plans: Any) -> Any:
        """On the coordinator, before any rank writes: the step directory taken for this save
        (:func:`take_step`) — a second save into it at once fails before it writes a byte."""
        self._release()
        self._step = take_step(self.path)
        return super().prepare_global_plan(plans)

    def finish(self, metadata: Any, results: list[list[WriteResult]]) -> None:
        try:
            super().finish(metadata, results)
        finally:
            self._release()

    def _release(self) -> None:
        if self._step is not None:
            os.close(self._step)  # the lock goes with the descriptor
            self._step = None


class SaveBusy(RuntimeError):
    """Another save is writing the same step directory at this moment: two saves into one step
    would interleave their files under one seal, which neither wrote."""


def take_step(path: str | os.PathLike) -> int | None:
    """An exclusive lock on the step directory (``flock`` on the directory itself: released
    when the save finishes, or its process dies, whatever happens to it); :class:`SaveBusy`
    when another save holds it. A file system that cannot lock (some NFS and Lustre mounts)
    saves unlocked, with a warning. Returns the descriptor holding the lock."""
    import errno
    import fcntl
    import warnings

    directory = os.fspath(path)
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None  # not a local directory (an object store's prefix): nothing to lock
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        os.close(fd)
        raise SaveBusy(
            f"another save is writing {directory} right now: two saves into one step would leave files of both "
            "under one seal; save each step once (or wait for the other save to finish)"
        ) from None
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF, errno.ENOSYS):
            warnings.warn(
                f"{directory}: this file system cannot lock a directory; saved without excluding another save",
                stacklevel=2,
            )
            return None
        raise


class _SealedWriter(_Sealing, StorageWriter):
    """Another ``FileSystemWriter`` (s3torchconnector's ``S3StorageWriter``…) sealing as it
    writes: every call goes to it, its file system wrapped (see :func:`sealing`)."""

    def __init__(self, inner: Any, key: bytes | None, chunk_size: int) -> None:
        self.inner = inner
        self._init_sealing(key, chunk_size)

    @property
    def fs(self) -> Any:
        return self.inner.fs

    @fs.setter
    def fs(self, value: Any) -> None:
        self.inner.fs = value

    @property
    def path(self) -> Any:
        return self.inner.path

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)  # stage, storage_meta, checkpoint_id, … (DCP's async staging included)

    def _base_reset(self, checkpoint_id: Any) -> None:
        self.inner.reset(checkpoint_id)

    def _base_write_data(self, plan: Any, planner: Any) -> Any:
        return self.inner.write_data(plan, planner)

    def _base_finish(self, metadata: Any, results: Any) -> None:
        self.inner.finish(metadata, results)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.inner.set_up_storage_writer(is_coordinator, *args, **kwargs)

    def prepare_local_plan(self, plan: Any) -> Any:
        return self.inner.prepare_local_plan(plan)

    def prepare_global_plan(self, plans: Any) -> Any:
        return self.inner.prepare_global_plan(plans)

    def storage_meta(self) -> Any:
        return self.inner.storage_meta()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return True  # the wrapped writer's own check runs in its reset


def sealing(writer: Any, *, key: bytes | None = None, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Any:
    """A ``FileSystemWriter`` of any kind — s3torchconnector's ``S3StorageWriter``, writing
    straight to S3, included — sealing as it writes: hand DCP the writer this returns."""
    if isinstance(writer, _Sealing):
        return writer
    if not isinstance(writer, FileSystemWriter):
        raise TypeError(
            f"{type(writer).__name__} is not a FileSystemWriter: drill seals what DCP's file-system writers write"
        )
    return _SealedWriter(writer, key, chunk_size)


def manifest_bytes(name: str, files: dict[str, FileHashes], key: bytes | None, chunk_size: int) -> bytes:
    """The manifest of these files, as ``drill seal`` writes it."""
    from drill.checkpoints import step_of

    manifest = manifest_of(files, step=step_of(name), chunk_size=chunk_size)
    manifest.key_id = key_id(key) if key is not None else None
    return manifest.to_json(key)


def write_manifest(checkpoint: Path, files: dict[str, FileHashes], key: bytes | None, chunk_size: int) -> str:
    """``drill-manifest.json`` into a local checkpoint directory, atomically."""
    return _SealingFileSystem(FileSystem(), chunk_size).write_manifest(checkpoint, files, key)


__all__ = ["SaveBusy", "SealReport", "SealingWriter", "manifest_bytes", "sealing", "take_step", "write_manifest"]
