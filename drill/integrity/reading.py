"""Reading a file's bytes exactly once, hashed on the way in.

Torch-free, so ``drill verify`` and ``drill seal`` use it without importing torch. A file that
changes size while it is read (truncated by a re-save, appended to) is an ``EOFError``, which
the checks report as ``file-changed``; transient I/O errors (EIO on a flaky mount, ESTALE on
NFS) are retried a bounded number of times before the file counts as unreadable.
"""

from __future__ import annotations

import errno
import io
import mmap
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from queue import SimpleQueue
from typing import Any

import xxhash

from drill.integrity.hashing import DEFAULT_CHUNK_SIZE, ChunkHasher, FileHashes, crc32
from drill.memory import in_memory, populate
from drill.storage import FileChanged, NotARegularFile, PathEscapesCheckpoint, Storage, StorageUnavailable

READ_CHUNK = 8 << 20
"""Bytes per read call into a buffer of drill's own: large enough to stream at page-cache speed."""

SCRATCH_MIN = 64 << 10
"""The least scratch buffer a reader skips bytes through (it grows to the longest skip)."""
PIECE = 1 << 20
"""Bytes per read call into a destination that is hashed as it fills (a tensor's bytes): each
piece is hashed — and its CRC-32 taken — while it is still in the core's cache, one pass through
memory instead of one per check (measured by ``benchmarks/limit.py``)."""

SPAN_READ = 1 << 20
"""Bytes per positioned read when only the digests are wanted: the buffer stays in the core's
cache between the copy out of the page cache and the hash (8 MiB buffers hash 25% slower)."""

TRANSIENT = frozenset({errno.EIO, errno.EAGAIN, errno.EINTR, errno.ETIMEDOUT, errno.ESTALE, errno.ECONNRESET})
ATTEMPTS = 3
"""Reads of one file before a transient error counts: the first and two retries."""


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


def span_digests(fd: int, start: int, length: int, chunk_size: int, *, ends: bool = False) -> list[bytes]:
    """The chunk digests of ``length`` bytes at ``start`` (a chunk boundary), read with
    positioned reads, so that spans of one file hash on several cores at once. A small span is
    one read (thousands of small files pay for nothing else). :class:`FileChanged` when the file
    ends before the span does — or, where the span ``ends`` the file as listed, after it."""
    end = start + length
    if length <= SPAN_READ:
        data = os.pread(fd, length + 1 if ends else length, start)
        if len(data) < length:
            raise FileChanged(
                f"file shrank while it was read: it ends at byte {start + len(data)}, {end} or more when listed"
            )
        if len(data) > length:
            raise _grew(fd, end)
        if length <= chunk_size:  # one chunk (an empty file too): most files of a checkpoint of many small ones
            return [xxhash.xxh3_128_digest(data)]
        view = memoryview(data)
        return [xxhash.xxh3_128(view[o : o + chunk_size]).digest() for o in range(0, length, chunk_size)]
    hasher = ChunkHasher(chunk_size)
    buf = memoryview(mmap.mmap(-1, SPAN_READ))
    pos = start
    while pos < end:
        n = os.preadv(fd, [buf[: min(len(buf), end - pos)]], pos)
        if not n:
            raise FileChanged(f"file shrank while it was read: it ends at byte {pos}, {end} or more when listed")
        hasher.update(buf[:n])
        pos += n
    if ends and os.pread(fd, 1, end):
        raise _grew(fd, end)
    return hasher.finish().chunks


def _grew(fd: int, listed: int) -> FileChanged:
    return FileChanged(
        f"file grew while it was read: {os.fstat(fd).st_size} bytes by the end of the read, {listed} when listed"
    )


INFRASTRUCTURE = frozenset({"denied", "unavailable"})
"""Read errors that are the storage's fault, not the checkpoint's: a drill that meets one
ends as ``error`` (exit 5), never ``failed`` (see :mod:`drill.verdict`)."""


def describe_read_error(exc: BaseException) -> tuple[str, str]:
    """(message, kind) for a file that could not be read: kind is ``missing``, ``escapes``,
    ``not-regular``, ``changed``, ``unreadable``, or — the storage's fault — ``denied``
    (permissions, credentials) and ``unavailable`` (retries exhausted, an endpoint away)."""
    if isinstance(exc, StorageUnavailable):
        return exc.strerror or str(exc), "unavailable"
    if isinstance(exc, PermissionError):
        return exc.strerror or str(exc), "denied"
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


class SequentialReader:
    """One pass over a file in order: every byte read once and hashed as it arrives, wherever
    it goes — a small buffer, or straight into the tensor that holds it.

    ``peek`` reads ahead out of order (to learn where a record's bytes are) without hashing:
    those bytes are read again, in order, when the pass reaches them.
    """

    def __init__(
        self, f: io.RawIOBase, size: int, hasher: ChunkHasher | None, on_bytes: Callable[[int], None] = lambda n: None
    ) -> None:
        self.f, self.size, self.hasher, self.on_bytes = f, size, hasher, on_bytes
        self.pos = 0
        self._scratch: memoryview | None = None
        self._lane: CrcLane | None = None
        """The lane hashing what was read into a target, when it may still be behind."""

    def read(self, n: int) -> memoryview:
        """The next ``n`` bytes, in a buffer of their own."""
        view = memoryview(bytearray(n))
        self.read_into(view)
        return view

    def read_into(self, view: memoryview, crc: Crc | CrcLane | None = None) -> None:
        """Fill ``view`` with the next ``len(view)`` bytes, hashing each piece as it lands
        and handing it to ``crc`` while it is still in cache. :class:`FileChanged` if the file
        ends first.

        With a :class:`CrcLane` (``view`` is a target's memory, not a buffer read into again),
        the lane takes the hashing too: this thread only reads, the lane hashes and takes the
        CRC of each piece in order, still in the cache the cores share — two cores on one
        file's bytes. The hasher is the lane's until the next read this thread hashes itself;
        a small read in between (an entry's header, its trailer) is handed to the lane as a copy,
        in order, so the reader does not wait for the lane at every entry."""
        handing: CrcLane | None = None
        if isinstance(crc, CrcLane) and self.hasher is not None:
            self._lane = crc
            hasher: ChunkHasher | None = None
            crc.hashing(self.hasher)
        elif self._lane is not None and len(view) <= HAND_OVER:
            handing, hasher = self._lane, None
        else:
            self._caught_up()
            hasher = self.hasher
        got, total, handed = 0, len(view), 0
        while got < total:
            piece = view[got : got + PIECE]
            n = self.f.readinto(piece)
            if not n:
                raise FileChanged(
                    f"file shrank while it was read: it ends at byte {self.pos + got}, {self.size} bytes when listed"
                )
            if n < len(piece):
                piece = piece[:n]
            if hasher is not None:
                hasher.update(piece)
            got += n
            if crc is not None and (got - handed >= CRC_BATCH or got == total):
                crc.update(view[handed:got])
                handed = got
            self.on_bytes(n)
        if handing is not None:
            handing.hash(bytes(view))
        self.pos += got

    def skip_to(self, offset: int) -> None:
        """Read (and hash) everything up to ``offset``, keeping none of it — into a scratch
        buffer as large as the longest skip so far, up to :data:`READ_CHUNK`: the skips between
        a checkpoint's tensors are a few hundred bytes, and a zeroed 8 MiB buffer for them cost
        the first load 3-4 ms of page faults."""
        while self.pos < offset:
            n = min(READ_CHUNK, offset - self.pos)
            if self._scratch is None or len(self._scratch) < n:
                self._scratch = memoryview(bytearray(max(n, SCRATCH_MIN)))
            self.read_into(self._scratch[:n])

    def peek(self, offset: int, n: int) -> memoryview:
        """``n`` bytes at ``offset``, read out of order and not hashed."""
        if hasattr(self.f, "pread"):  # object storage: one ranged request beside the read-ahead
            data = self.f.pread(offset, n)
        else:
            data = os.pread(self.f.fileno(), n, offset)
        if len(data) < n:
            raise FileChanged(
                f"file shrank while it was read: {offset + len(data)} bytes where {offset + n} were listed"
            )
        return memoryview(data)

    def finish(self) -> FileHashes | None:
        """Read to the size the file had when listed; :class:`FileChanged` if it grew."""
        self.skip_to(self.size)
        self._caught_up()
        if self.f.read(1):
            raise FileChanged(f"file grew while it was read: more than the {self.size} bytes it had when listed")
        return self.hasher.finish() if self.hasher is not None else None

    def _caught_up(self) -> None:
        """Wait until the lane has hashed all it was handed: the hasher is this thread's again."""
        if self._lane is not None:
            self._lane.hashing(None)
            self._lane.drain()
            self._lane = None


class Crc:
    """A running CRC-32, taken inline (a small entry: not worth another core)."""

    __slots__ = ("_value",)

    def __init__(self) -> None:
        self._value = 0

    def update(self, piece: memoryview) -> None:
        self._value = crc32(piece, self._value)

    def value(self) -> int:
        return self._value


CRC_BATCH = 1 << 20
"""Bytes handed to the lane at a time: each piece as it lands, still in the cache the cores
share, and the reader waits for no more than one piece's hash and CRC at a target's end
(1 MiB against 4 and 8: 12% and 26% faster on 0.3 GB, ``benchmarks/limit.py``)."""

HAND_OVER = 64 << 10
"""Reads up to this size made while the lane holds the hasher are copied to it to hash, in
order, instead of waiting for it to catch up: the few hundred bytes between two tensors."""

LANE_MIN = 8 << 20
"""Entries at least this large have their CRC-32 taken on the :class:`CrcLane`."""

POPULATORS = 2
"""Threads that fault a target in (:meth:`CrcLane.populate`), each a part of it: faulting in
fresh pages is the kernel's work on the core that asks, and one thread of it was the longest
path of a load into fresh targets (0.3 GB on the 2-core AMD EPYC VM: 155-225 ms with one, 128-208
with two, interleaved; ``benchmarks/limit.py``)."""

_BEGIN, _END = object(), object()


class CrcLane:
    """CRC-32s taken on another core, in order, while the reader thread goes on reading. Each
    piece is handed over as soon as it has landed, so the lane reads it from the cache the
    cores share, not from DRAM: the check costs CPU, not wall time. While a reader has handed
    it its hasher (:meth:`hashing`), the lane hashes the pieces too; targets to fault in
    (:meth:`populate`) go to threads of their own. One lane per reader thread, started on first
    use; :meth:`close` when done."""

    def __init__(self) -> None:
        self._jobs: SimpleQueue[object] = SimpleQueue()
        self._results: SimpleQueue[int] = SimpleQueue()
        self._synced: SimpleQueue[BaseException | None] = SimpleQueue()
        self._thread: threading.Thread | None = None
        self._populators: list[threading.Thread] = []
        self._populating: SimpleQueue[_Populate | None] = SimpleQueue()

    def begin(self) -> CrcLane:
        """Start a new CRC (of one entry)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="drill-crc", daemon=True)
            self._thread.start()
        self._jobs.put(_BEGIN)
        return self

    def update(self, piece: memoryview) -> None:
        self._jobs.put(piece)

    def hash(self, data: bytes) -> None:
        """Hash ``data`` (read between two CRCs: no entry's) in its turn, with the hasher the
        lane holds."""
        if self._thread is None:  # closed (or never begun): nothing would hash it, and no drain would say so
            raise RuntimeError("bytes handed to a CRC lane that is not running")
        self._jobs.put(_Hash(data))

    def hashing(self, hasher: ChunkHasher | None) -> None:
        """Hash the pieces handed from now on with ``hasher`` too (None: no longer)."""
        if self._thread is not None:
            self._jobs.put(_Hashing(hasher))

    def populate(self, address: int, length: int) -> None:
        """Fault in the pages of the target at ``address`` (``length`` bytes) on threads of
        their own (:func:`drill.memory.populate`, :data:`POPULATORS` parts of it at once, cut on
        page boundaries), in the order asked, beside the hashing: asked for the next target
        while the reader fills this one, it is there before the reads. A target already in
        memory (a live trainer's, :func:`drill.memory.in_memory`: one ``mincore``, asked here) is
        not handed over: no thread starts for it."""
        if in_memory(address, length):
            return
        if not self._populators:
            for _ in range(POPULATORS):
                thread = threading.Thread(target=self._populate, name="drill-populate", daemon=True)
                thread.start()
                self._populators.append(thread)
        page, end = mmap.PAGESIZE, address + length
        cuts = [min(end, -(-(address + length * k // POPULATORS) // page) * page) for k in range(1, POPULATORS)]
        for at, until in zip([address, *cuts], [*cuts, end], strict=True):
            if until > at:
                self._populating.put(_Populate(at, until - at))

    def _populate(self) -> None:
        while (job := self._populating.get()) is not None:
            populate(job.address, job.length)

    def drain(self) -> None:
        """Wait until every piece handed so far is hashed and taken into its CRC; raises what
        stopped the lane, if anything did."""
        if self._thread is not None:
            self._jobs.put(_DRAIN)
            failed = self._synced.get()
            if failed is not None:
                raise failed

    def end(self) -> None:
        """End the CRC begun last, without waiting: :meth:`result` gives it, in order."""
        self._jobs.put(_END)

    def result(self) -> int:
        """The oldest ended CRC-32 not yet taken, once the lane has caught up."""
        return self._results.get()

    def value(self) -> int:
        """The CRC-32 of everything since :meth:`begin`, once the lane has caught up."""
        self.end()
        return self.result()

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None
        for _ in self._populators:
            self._populating.put(None)
        self._populators = []

    def _run(self) -> None:
        value, hasher, failed = 0, None, None
        while (job := self._jobs.get()) is not None:
            if job is _BEGIN:
                value = 0
            elif job is _END:
                self._results.put(value)
            elif job is _DRAIN:
                self._synced.put(failed)
                failed = None
            elif isinstance(job, _Hashing):
                hasher = job.hasher
            else:
                try:
                    if isinstance(job, _Hash):  # bytes between two entries: hashed, in no CRC
                        data: Any = job.data
                    else:
                        data = job
                        value = crc32(job, value)
                    if hasher is not None:
                        hasher.update(data)
                except Exception as exc:  # noqa: BLE001 - handed to the reader at the next drain
                    failed = failed or exc


_DRAIN = object()


@dataclass(frozen=True, slots=True)
class _Hashing:
    hasher: ChunkHasher | None


@dataclass(frozen=True, slots=True)
class _Hash:
    data: bytes


@dataclass(frozen=True, slots=True)
class _Populate:
    address: int
    length: int
