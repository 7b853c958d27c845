"""Hashing spans of local files through read-only mappings, in forked workers.

A positioned read copies every byte out of the page cache before xxh3 sees it; through a
mapping xxh3 reads the page cache itself, about twice the bytes per core
(``benchmarks/verify.py``). A mapping has a hazard a read has not: a file truncated under it, or
an I/O error on a flaky mount, raises SIGBUS, which ends the process. So mappings are read only
in forked workers that may die: a span a worker does not report is hashed again with positioned
reads by the caller, and that read names the precise fault (a changed file, an unreadable one).

Only a process that nothing but drill runs in may fork (:func:`drill.proc.may_fork`); others
use positioned reads. The workers touch nothing but the file, ``mmap`` and ``xxhash``: no
import, no lock another thread could have held at the fork.
"""

from __future__ import annotations

import mmap
import os
import resource
import select
import struct
import sys
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from itertools import accumulate

import xxhash

from drill.integrity.hashing import AS_SEALED, AsSealed
from drill.integrity.reading import span_digests
from drill.proc import death_signal, die_with_parent, reap, write_all

Span = tuple[str, int, int]
"""(uri, start, length): ``start`` on a chunk boundary, so a span's digests are the file's."""

_HEAD = struct.Struct("<II")
"""Each finished span, from a worker: its index and digest count, then the 16-byte digests;
or, with :data:`_AS_SEALED` set in the index, a run of that many spans from it that matched
their seal (no digests)."""
_AS_SEALED = 1 << 31
_DIGEST = 16
_INDEX = struct.Struct("<I")
WINDOW = 256 << 20
"""Bytes mapped at once: a worker's mappings stay bounded however large the shard."""
SMALL_SPAN = 1 << 20
"""Spans up to this size are read, not mapped."""
REPORT_BYTES = 1 << 15
"""Reports a worker collects before writing them to its pipe."""


class Workers:
    """Forked workers hashing spans through mappings, started and not yet collected: the
    caller goes on with other work while they hash, then asks :meth:`results` once — each
    span's chunk digests, or None where no worker reported it (a fault in the mapping, a file
    shorter than the span, a worker that died), to be hashed the ordinary way — or
    :meth:`stop`, which kills any still running. Each reports into a pipe large enough for
    thousands of small files' digests, so a worker does not wait for the caller to read.

    ``sizes``: each file's listed size; a span that ends there is reported only if the file
    is no longer than that when it has been read (a file that grew is read again, and found).
    ``sealed``: the sealed chunk digest (hex) of files of one chunk, where ``sizes`` are their
    sealed sizes: a whole such file read at that size with that digest is reported
    :data:`~drill.integrity.hashing.AS_SEALED`, not by its digest."""

    def __init__(
        self,
        open_fd: Callable[[str], int],
        spans: Sequence[Span],
        chunk_size: int,
        workers: int,
        sizes: Mapping[str, int] | None = None,
        sealed: Mapping[str, str] | None = None,
    ) -> None:
        self.spans = spans
        self._pids: list[int] = []
        self._pipes: dict[int, bytearray] = {}
        self._open: list[int] = []
        """The pipes' read ends, until :meth:`stop` closes them."""
        self._done: list[list[bytes] | AsSealed | None] | None = None
        if not spans:
            return
        for stream in (sys.stdout, sys.stderr):  # a fork copies unflushed buffers: printed twice
            if stream is not None:  # None: a process started without it
                stream.flush()
        death_signal()  # resolved here: a worker imports nothing
        parent = os.getpid()
        bounds = runs(spans, workers)
        jobs = _job_queue(len(bounds) - 1)
        try:
            for n in range(min(workers, len(spans))):
                read_fd, write_fd = os.pipe()
                _widen(read_fd)
                try:
                    pid = os.fork()
                except OSError:  # no memory or no process slot for another: its spans are read instead
                    os.close(read_fd)
                    os.close(write_fd)
                    break
                if pid == 0:  # pragma: no cover - the worker; its report is checked by the caller
                    os.close(read_fd)
                    _work(parent, n > 0, write_fd, jobs, bounds, open_fd, spans, chunk_size, sizes or {}, sealed or {})
                os.close(write_fd)
                self._pids.append(pid)
                self._pipes[read_fd] = bytearray()
                self._open.append(read_fd)
        except BaseException:
            self.stop()
            raise
        finally:
            os.close(jobs)

    def results(self) -> list[list[bytes] | AsSealed | None]:
        """Each span's digests (or :data:`~drill.integrity.hashing.AS_SEALED`), or None where no
        worker reported it; waits for the workers."""
        if self._done is None:
            done: list[list[bytes] | AsSealed | None] = [None] * len(self.spans)
            try:
                _collect(self._pipes)
            finally:
                self.stop()
            for data in self._pipes.values():
                _parse(data, done)
            self._done = done
        return self._done

    def stop(self) -> None:
        """Close the pipes and reap the workers, killing any still running (the caller was
        interrupted, or no longer needs their digests)."""
        fds, self._open = self._open, []
        for fd in fds:
            os.close(fd)
        pids, self._pids = self._pids, []
        reap(pids)


PIPE_BYTES = 1 << 20
"""What a worker's pipe holds (Linux's default ceiling for an unprivileged process): the
reports of some 40,000 small files, written while the caller does other work."""


def _widen(fd: int) -> None:
    """Grow the pipe to :data:`PIPE_BYTES` where the system allows (Linux); else leave it."""
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (ImportError, AttributeError, OSError):
        pass


MAX_JOBS = 65536 // 4
"""Jobs a pipe buffer holds."""
JOBS_PER_WORKER = 64
"""Runs of spans per worker: enough that a worker on a busy core takes fewer of them, few
enough that thousands of small files are not a pipe read each."""
SPAN_COST = 64 << 10
"""What opening a span's file costs, in bytes hashed: a run of thousands of small files is
as much work as a few large spans."""


def runs(spans: Sequence[Span], workers: int) -> list[int]:
    """Where each job's run of spans begins (and, last, where the final one ends): runs of
    about equal work — bytes plus :data:`SPAN_COST` a span — and a span never split."""
    jobs = max(1, min(len(spans), MAX_JOBS, workers * JOBS_PER_WORKER))
    done = list(accumulate(n + SPAN_COST for _, _, n in spans))  # work up to and including each span
    total = done[-1] if done else 0
    bounds = [0]
    for k in range(1, jobs):  # job k begins after the first span that completes k/jobs of the work
        i = bisect_left(done, -(-total * k // jobs)) + 1
        if bounds[-1] < i < len(spans):
            bounds.append(i)
    bounds.append(len(spans))
    return bounds


def _job_queue(jobs: int) -> int:
    """A pipe holding job numbers (each a run of spans, :func:`runs`), its write end
    closed: each worker takes the next job when it is free (a 4-byte read from a pipe is
    atomic), so a worker on a busy core takes fewer spans instead of holding the others up."""
    read_fd, write_fd = os.pipe()
    try:
        write_all(write_fd, b"".join(_INDEX.pack(i) for i in range(jobs)))
    finally:
        os.close(write_fd)
    return read_fd


def _collect(pipes: dict[int, bytearray]) -> None:
    """Read every worker's reports until each closes its pipe (by finishing or dying)."""
    open_fds = set(pipes)
    while open_fds:
        ready, _, _ = select.select(list(open_fds), [], [])
        for fd in ready:
            chunk = os.read(fd, PIPE_BYTES)
            if chunk:
                pipes[fd] += chunk
            else:
                open_fds.discard(fd)


def _parse(data: bytearray, done: list[list[bytes] | AsSealed | None]) -> None:
    """Complete reports only: a worker that died mid-write leaves its span unreported."""
    reports = bytes(data)  # one copy: each digest is then a slice of it
    pos, size, head = 0, len(reports), _HEAD.size
    while pos + head <= size:
        index, count = _HEAD.unpack_from(reports, pos)
        pos += head
        if index & _AS_SEALED:  # a run of spans that matched their seal
            index &= ~_AS_SEALED
            if index + count > len(done):
                return
            done[index : index + count] = [AS_SEALED] * count
            continue
        end = pos + count * _DIGEST
        if end > size or index >= len(done):
            return
        # Thousands of small files report one digest each: no loop for those.
        done[index] = [reports[pos:end]] if count == 1 else [reports[i : i + _DIGEST] for i in range(pos, end, _DIGEST)]
        pos = end


def _work(
    parent: int,
    background: bool,
    fd: int,
    jobs: int,
    bounds: list[int],
    open_fd: Callable[[str], int],
    spans: Sequence[Span],
    chunk_size: int,
    sizes: Mapping[str, int],
    sealed: Mapping[str, str],
) -> None:  # pragma: no cover
    code = 1
    try:
        _detach(parent, background)
        reports = bytearray()
        run = [0, 0]  # spans that matched their seal, in a row: the first's index, how many
        # A whole file of one chunk — each of thousands of small files — in one open and one
        # read, where the opener offers that (a file it cannot read so is read the checked way).
        exactly = getattr(open_fd, "exactly", None)
        whole = min(chunk_size, SMALL_SPAN) if exactly is not None else 0
        head, digest = _HEAD.pack, xxhash.xxh3_128_digest if whole else None
        while len(taken := os.read(jobs, _INDEX.size)) == _INDEX.size:
            job = _INDEX.unpack(taken)[0]
            for index in range(bounds[job], bounds[job + 1]):
                uri, start, length = spans[index]
                ends = start + length == sizes.get(uri, -1)
                if length <= whole and ends and not start:  # ``whole`` is 0 without ``exactly``
                    data = exactly(uri, length)  # type: ignore[misc]
                    if data is not None:
                        found = digest(data)  # type: ignore[misc]
                        if sealed.get(uri) != found.hex():
                            reports += head(index, 1) + found
                        elif run[1] and run[0] + run[1] == index:
                            run[1] += 1
                        else:
                            _as_sealed(reports, run)
                            run[:] = [index, 1]
                        continue
                digests = _digests(open_fd, uri, start, length, chunk_size, ends)
                if digests is not None:
                    reports += _HEAD.pack(index, len(digests)) + b"".join(digests)
                if len(reports) >= REPORT_BYTES:  # many small files: one write per batch, not per file
                    write_all(fd, reports)
                    reports.clear()
        _as_sealed(reports, run)
        write_all(fd, reports)
        code = 0
    finally:
        os._exit(code)


def _as_sealed(reports: bytearray, run: list[int]) -> None:  # pragma: no cover - in the worker
    """The run of spans that matched their seal, reported (if any)."""
    if run[1]:
        reports += _HEAD.pack(run[0] | _AS_SEALED, run[1])


BACKGROUND_NICE = 10
"""How much lower than the caller's a worker's CPU priority is, for every worker but the first."""


def _detach(parent: int, background: bool) -> None:  # pragma: no cover - in the worker
    """Die with the parent, with default signals (the parent's handlers raise into its own
    code), and quiet when a mapping faults: no core file, no fault handler's dump. A
    ``background`` worker (every one but the first) runs :data:`BACKGROUND_NICE` lower: the
    caller's own work — parsing the seal, loading its command line, listing and comparing —
    is what its result waits for, and on a machine with as many runnable processes as cores
    (two workers, the caller and its listing child on two cores) a worker at the same
    priority takes a share of the core that work needs. The first worker hashes at the
    caller's priority, so a busy machine never leaves the hashing with less than one worker;
    the others take what is left idle, and take the spans still queued when the caller waits."""
    die_with_parent(parent)
    if background:
        try:
            os.nice(BACKGROUND_NICE)
        except OSError:  # not permitted here: the same priority as the first
            pass
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    handler = sys.modules.get("faulthandler")  # enabled by PYTHONFAULTHANDLER, -X faulthandler, pytest
    if handler is not None:
        handler.disable()


def _digests(
    open_fd: Callable[[str], int], uri: str, start: int, length: int, chunk_size: int, ends: bool = False
) -> list[bytes] | None:  # pragma: no cover
    """The span's chunk digests, through one window of whole chunks at a time (a small span is
    read in one positioned read: a mapping's set-up costs more than copying it). None when the
    file is shorter than the span, or — the span ``ends`` the file — longer than it."""
    window = max(1, WINDOW // chunk_size) * chunk_size
    fd = open_fd(uri)
    try:
        if length <= SMALL_SPAN:  # a mapping's set-up costs more than copying the span
            try:
                return span_digests(fd, start, length, chunk_size, ends=ends)
            except (EOFError, OSError):
                return None  # the positioned read in the parent reports it
        if os.fstat(fd).st_size < start + length:
            return None  # shrank since it was listed: a mapping past its end would fault
        digests: list[bytes] = []
        for at in range(start, start + length, window):
            digests += _window(fd, at, min(window, start + length - at), chunk_size)
        if ends and os.fstat(fd).st_size != start + length:
            return None  # grew while it was read
        return digests
    finally:
        os.close(fd)


_POPULATED = getattr(mmap, "MAP_POPULATE", 0)
"""Mapped with every page in place (Linux, where alone workers fork): one pass of the kernel over the window's pages in
the page cache, instead of a fault every 64 KiB (fault-around: 14,000 traps per 1.2 GB). On the
Intel Xeon VM a 1.2 GB ``drill verify`` went from 1.21 / 1.20 to 1.17 / 1.17 of ``xxhsum``'s
time with a core held (0.85 / 0.81 to 0.80 / 0.79 idle); on an AMD EPYC VM it changed nothing
(docs/figures.md)."""


def _window(fd: int, at: int, length: int, chunk_size: int) -> list[bytes]:  # pragma: no cover - in the worker
    skew = at % mmap.ALLOCATIONGRANULARITY  # a mapping starts on a page; a chunk need not
    with mmap.mmap(fd, skew + length, flags=mmap.MAP_SHARED | _POPULATED, prot=mmap.PROT_READ, offset=at - skew) as m:
        view = memoryview(m)[skew:]
        try:
            return [xxhash.xxh3_128(view[o : o + chunk_size]).digest() for o in range(0, length, chunk_size)]
        finally:
            view.release()
