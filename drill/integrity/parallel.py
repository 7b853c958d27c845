"""Hashing a checkpoint's files on every core this process may use.

A local file is cut into spans of whole chunks, so one big shard does not hash on one core.
Where this process may fork, the spans are hashed through mappings in forked workers
(:mod:`drill.integrity.mapped`, twice the bytes per core); what they leave — a span whose
mapping faulted, everything where forking is not safe — is read with positioned reads on
threads, a run of spans to a thread. Files are opened by relative path beneath the checkpoint
(no ``stat`` of each, no re-check after). Object storage streams each file (its reader reads
ahead by itself), as does a file that needs SHA-256 besides.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

from drill.integrity.hashing import AsSealed, FileHashes
from drill.integrity.reading import FileChanged, hash_stream, span_digests
from drill.storage import Storage

Span = tuple[str, int, int]
"""(file, start, length): a run of whole chunks of one file."""


def hash_files(
    storage: Storage,
    checkpoint: str,
    sizes: Mapping[str, int],
    chunk_size: int,
    workers: int | None = None,
    sha256: frozenset[str] = frozenset(),
) -> dict[str, FileHashes | OSError]:
    """Hash each file (path → listed size) on ``workers`` (default: one per core this process
    may use that other work is not keeping busy, at most 8). A file that cannot be read, or
    changes size while it is read, maps to its error."""
    with Hashing(storage, checkpoint, sizes, chunk_size, workers, sha256) as hashing:
        return cast("dict[str, FileHashes | OSError]", hashing.results())  # no seal handed: every digest back


class Hashing:
    """Files being hashed (:func:`hash_files`): the forked workers are started here, and the
    caller may do other work before it asks for :meth:`results` — what the workers leave is
    read then, on threads. Leaving the ``with`` block stops workers still running."""

    def __init__(
        self,
        storage: Storage,
        checkpoint: str,
        sizes: Mapping[str, int],
        chunk_size: int,
        workers: int | None = None,
        sha256: frozenset[str] = frozenset(),
        sealed: Mapping[str, str] | None = None,
    ) -> None:
        self.storage, self.checkpoint, self.chunk_size, self.sha256 = storage, checkpoint, chunk_size, sha256
        self.sizes = {rel: sizes[rel] for rel in sorted(sizes)}
        self.workers = workers or free_cores(8)
        spannable = getattr(storage, "positioned_reads", False)
        self.spans: list[Span] = []
        self.streamed: list[str] = []
        span, streamed = self.spans.append, self.streamed.append
        for rel, size in self.sizes.items():
            if not spannable or not size or rel in sha256:
                streamed(rel)
            elif size <= chunk_size:  # one span: each of thousands of small files
                span((rel, 0, size))
            else:
                self.spans += [(rel, a, n) for a, n in _spans(size, chunk_size, self.workers)]
        self._opener = _opener(storage, checkpoint, bool(self.spans))
        try:
            self._mapped = _mapped(self._opener, self.spans, self.sizes, chunk_size, self.workers, sealed)
        except BaseException:
            self._opener.close()
            raise
        self._results: dict[str, FileHashes | OSError | AsSealed] | None = None

    def results(self) -> dict[str, FileHashes | OSError | AsSealed]:
        """Each file's hashes, or its error, once every file has been read (or, for a file
        ``sealed`` names, :data:`~drill.integrity.hashing.AS_SEALED` where it matched)."""
        if self._results is None:
            try:
                got = self._mapped.results() if self._mapped is not None else [None] * len(self.spans)
                out = self._read_left(got)
            finally:
                self.stop()
            out.update(_joined(self.spans, got, self.sizes, self.chunk_size))
            # Spans are in the files' order: only files read whole (streamed) come first.
            self._results = results = {rel: out[rel] for rel in self.sizes} if self.streamed else out
            return results
        return self._results

    def _read_left(
        self, got: list[list[bytes] | OSError | AsSealed | None]
    ) -> dict[str, FileHashes | OSError | AsSealed]:
        """Read, on threads, the files that are streamed and the spans no worker reported
        (``got`` is filled in); the streamed files' hashes."""
        left = [i for i, g in enumerate(got) if g is None]
        if not self.streamed and not left:
            return {}
        from concurrent.futures import ThreadPoolExecutor

        storage, checkpoint, sizes, chunk = self.storage, self.checkpoint, self.sizes, self.chunk_size
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            whole = {
                rel: pool.submit(_streamed, storage, checkpoint, rel, sizes[rel], chunk, rel in self.sha256)
                for rel in self.streamed
            }
            runs = _in_runs(self.spans, left, self.workers)
            read = [pool.submit(_read_run, self._opener, [self.spans[i] for i in run], sizes, chunk) for run in runs]
            for run, f in zip(runs, read, strict=True):
                for i, result in zip(run, f.result(), strict=True):
                    got[i] = result
            return {rel: f.result() for rel, f in whole.items()}

    def stop(self) -> None:
        """Stop the workers (killing any still running) and release the checkpoint's directory."""
        if self._mapped is not None:
            self._mapped.stop()
        self._opener.close()

    def __enter__(self) -> Hashing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def usable_cores(cap: int) -> int:
    """Cores this process may run on (its CPU affinity, as a batch allocation sets it), at most ``cap``."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        n = os.cpu_count() or 1
    return max(1, min(cap, n))


def free_cores(cap: int) -> int:
    """Usable cores (:func:`usable_cores`) less the share other work keeps busy now (the
    machine's other runnable tasks, :func:`others_running`, in proportion) — at least one: a
    worker on a busy core only waits for it."""
    usable = usable_cores(cap)
    busy = others_running() / (os.cpu_count() or 1)
    return max(1, usable - int(usable * min(1.0, busy) + 0.25))


RUN_QUEUE = "/proc/loadavg"
"""Where Linux says how many tasks are runnable now (its fourth field, ``running/total``)."""


def others_running(looks: int = 3, apart: float = 0.0005) -> int:
    """Tasks other than this one that are running or waiting for a core right now: the kernel's
    run queue (``/proc/loadavg``'s fourth field, which counts this task too), the least of
    ``looks`` looks ``apart`` seconds apart, so a task that only passes through is not counted.
    Not the load average: that is the last minute's, and counts a drill that ran just before
    this one (a nightly loop, a benchmark) as if it still held a core. Where the kernel does
    not say, the load average."""
    least = None
    for i in range(looks):
        try:
            with open(RUN_QUEUE, "rb") as f:
                running = int(f.read().split()[3].split(b"/")[0]) - 1
        except (OSError, IndexError, ValueError):  # not Linux: the load average, or nothing
            try:
                return int(os.getloadavg()[0] + 0.5)
            except OSError:
                return 0
        least = running if least is None else min(least, running)
        if least <= 0:
            break
        if i + 1 < looks:
            time.sleep(apart)
    return max(0, least or 0)


SPAN_BYTES = 64 << 20
"""The most a span holds: spans are handed to whichever worker is free, so a worker on a busy
core takes fewer of them."""


def _spans(size: int, chunk: int, parts: int) -> list[tuple[int, int]]:
    """(start, length) of runs of whole chunks covering ``size`` (> 0) bytes: at least
    ``parts`` of them where there are as many chunks, none over :data:`SPAN_BYTES`."""
    if size <= chunk:  # most files of a checkpoint of many small ones
        return [(0, size)]
    chunks = -(-size // chunk)
    per = max(1, min(-(-chunks // max(1, parts)), SPAN_BYTES // chunk))
    return [(i * chunk, min(size, (i + per) * chunk) - i * chunk) for i in range(0, chunks, per)]


def _mapped(
    opener: Callable[[str], int],
    spans: list[Span],
    sizes: Mapping[str, int],
    chunk_size: int,
    workers: int,
    sealed: Mapping[str, str] | None = None,
) -> Any:
    """Forked workers hashing the spans through mappings (:class:`drill.integrity.mapped.Workers`),
    or None where this process may not fork (every span is then read on threads). Each span
    that ends a file also proves the file no longer than listed, so no file needs a ``stat`` after.
    ``sealed``: files of one chunk the workers compare with their seal themselves."""
    from drill.proc import may_fork

    if not spans or not may_fork():
        return None
    from drill.integrity.mapped import Workers

    return Workers(opener, spans, chunk_size, workers, sizes=sizes, sealed=sealed)


def _opener(storage: Storage, checkpoint: str, needed: bool) -> Any:
    """What opens a file of the checkpoint by relative path for positioned reads: the storage's
    own (local: :meth:`~drill.storage.local.LocalStorage.beneath`), else resolved then opened."""
    beneath = getattr(storage, "beneath", None)
    if needed and beneath is not None:
        try:
            return beneath(checkpoint)
        except OSError:  # the directory itself is gone or unreadable: each file says so
            pass
    return _Resolving(storage, checkpoint)


class _Resolving:
    """Opens a relative path the checked way: resolved (:meth:`Storage.child`), then opened."""

    def __init__(self, storage: Storage, checkpoint: str) -> None:
        self.storage, self.checkpoint = storage, checkpoint

    def __call__(self, rel: str) -> int:
        return self.storage.open_fd(self.storage.child(self.checkpoint, rel))  # type: ignore[attr-defined]

    def close(self) -> None:
        pass


def _in_runs(spans: list[Span], indices: list[int], workers: int) -> list[list[int]]:
    """The spans at ``indices`` in runs of about equal work (:func:`drill.integrity.mapped.runs`):
    a thread takes a run, not a file — thousands of small files are not thousands of tasks."""
    from drill.integrity.mapped import runs

    bounds = runs([spans[i] for i in indices], workers)
    return [indices[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def _read_run(
    opener: Callable[[str], int], run: list[Span], sizes: Mapping[str, int], chunk_size: int
) -> list[list[bytes] | OSError]:
    """Each span of the run read with positioned reads (:func:`span_digests`), or its error."""
    out: list[list[bytes] | OSError] = []
    for rel, a, n in run:
        try:
            fd = opener(rel)
        except OSError as exc:
            out.append(exc)
            continue
        try:
            out.append(span_digests(fd, a, n, chunk_size, ends=a + n == sizes[rel]))
        except FileChanged as exc:
            out.append(OSError(0, str(exc)))
        except OSError as exc:
            out.append(exc)
        finally:
            os.close(fd)
    return out


def _streamed(
    storage: Storage, checkpoint: str, rel: str, size: int, chunk_size: int, sha256: bool
) -> FileHashes | OSError:
    """A whole file hashed through the storage's reader (object storage; a file that needs SHA-256)."""
    try:
        return hash_stream(storage, storage.child(checkpoint, rel), size, chunk_size=chunk_size, sha256=sha256)
    except FileChanged as exc:
        return OSError(0, str(exc))
    except OSError as exc:
        return exc


def _joined(
    spans: list[Span], got: list[list[bytes] | OSError | AsSealed | None], sizes: Mapping[str, int], chunk_size: int
) -> dict[str, FileHashes | OSError | AsSealed]:
    """Each file's hashes from its spans' (in file order; each read proved the file's end where
    it reached it), or the first error among them."""
    out: dict[str, FileHashes | OSError | AsSealed] = {}
    for (rel, start, _), digests in zip(spans, got, strict=True):
        assert digests is not None  # every span was read by a worker or a thread
        if isinstance(digests, (AsSealed, OSError)):  # a whole file matched its seal, or failed
            out[rel] = digests
        elif not start:  # a file's first span
            out[rel] = FileHashes(sizes[rel], chunk_size, digests)
        elif isinstance(sofar := out[rel], FileHashes):  # not an error already
            sofar.chunks += digests
    return out
