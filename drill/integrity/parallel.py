"""Hashing a checkpoint's files on every core this process may use.

A local file is cut into spans of whole chunks, so one big shard does not hash on one core.
Where this process may fork, the spans are hashed through mappings in forked workers
(:mod:`drill.integrity.mapped`, twice the bytes per core); what they leave — a span whose
mapping faulted, everything where forking is not safe — is read with positioned reads on
threads, a run of spans to a thread. Files are opened by relative path beneath the checkpoint
(no ``stat`` of each, no re-check after). Object storage streams each file (its reader reads ahead by itself), as does a file
that needs SHA-256 besides.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from drill.integrity.hashing import FileHashes
from drill.integrity.reading import FileChanged, hash_stream, span_digests
from drill.storage import Storage

Spans = dict[str, list[tuple[int, int]]]
"""File → (start, length) of its spans, each a run of whole chunks."""
Digests = dict[tuple[str, int], list[bytes] | OSError]
"""(file, span start) → the span's chunk digests, or the error that stopped its read."""


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
    paths = sorted(sizes)
    workers = workers or free_cores(8)
    spannable = getattr(storage, "positioned_reads", False)
    spans = {
        rel: _spans(sizes[rel], chunk_size, workers) for rel in paths if spannable and rel not in sha256 and sizes[rel]
    }
    streamed = [rel for rel in paths if rel not in spans]
    out: dict[str, FileHashes | OSError] = {}
    with _opener(storage, checkpoint, bool(spans)) as opener:
        done: Digests = dict(_hash_mapped(opener, spans, sizes, chunk_size, workers))
        left = [(rel, a, n) for rel, parts in spans.items() for a, n in parts if (rel, a) not in done]
        if streamed or left:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=workers) as pool:
                whole = {
                    rel: pool.submit(_streamed, storage, checkpoint, rel, sizes[rel], chunk_size, rel in sha256)
                    for rel in streamed
                }
                read = [pool.submit(_read_run, opener, run, sizes, chunk_size) for run in _in_runs(left, workers)]
                out.update((rel, f.result()) for rel, f in whole.items())
                for f in read:
                    done.update(f.result())
    for rel, parts in spans.items():
        out[rel] = _joined(sizes[rel], chunk_size, [done[(rel, a)] for a, _ in parts])
    return {rel: out[rel] for rel in paths}


def usable_cores(cap: int) -> int:
    """Cores this process may run on (its CPU affinity, as a batch allocation sets it), at most ``cap``."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        n = os.cpu_count() or 1
    return max(1, min(cap, n))


def free_cores(cap: int) -> int:
    """Usable cores (:func:`usable_cores`) less the share other work keeps busy — the machine's
    load average over the last minute, in proportion — at least one: a worker on a busy core
    only waits for it."""
    usable = usable_cores(cap)
    try:
        busy = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # no load average on this system
        busy = 0.0
    return max(1, usable - int(usable * min(1.0, busy) + 0.25))


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


def _hash_mapped(
    opener: Callable[[str], int], spans: Spans, sizes: Mapping[str, int], chunk_size: int, workers: int
) -> dict[tuple[str, int], list[bytes]]:
    """The spans forked workers hashed through mappings; none where this process may not fork.
    Each span that ends a file also proves the file no longer than listed, so no file needs a
    ``stat`` after."""
    from drill.proc import may_fork

    if not spans or not may_fork():
        return {}
    from drill.integrity.mapped import hash_mapped

    keys = [(rel, a, n) for rel, parts in spans.items() for a, n in parts]
    got = hash_mapped(opener, keys, chunk_size, workers, sizes=sizes)
    return {(rel, a): digests for (rel, a, _), digests in zip(keys, got, strict=True) if digests is not None}


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

    def __enter__(self) -> _Resolving:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _in_runs(spans: list[tuple[str, int, int]], workers: int) -> list[list[tuple[str, int, int]]]:
    """The spans in runs of about equal work (:func:`drill.integrity.mapped.runs`): a thread
    takes a run, not a file — thousands of small files are not thousands of tasks."""
    from drill.integrity.mapped import runs

    bounds = runs(spans, workers)
    return [spans[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def _read_run(
    opener: Callable[[str], int], run: list[tuple[str, int, int]], sizes: Mapping[str, int], chunk_size: int
) -> Digests:
    """Each span of the run read with positioned reads (:func:`span_digests`), or its error."""
    out: Digests = {}
    for rel, a, n in run:
        try:
            fd = opener(rel)
        except OSError as exc:
            out[(rel, a)] = exc
            continue
        try:
            out[(rel, a)] = span_digests(fd, a, n, chunk_size, ends=a + n == sizes[rel])
        except FileChanged as exc:
            out[(rel, a)] = OSError(0, str(exc))
        except OSError as exc:
            out[(rel, a)] = exc
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


def _joined(size: int, chunk_size: int, parts: list[list[bytes] | OSError]) -> FileHashes | OSError:
    """One file's hashes from its spans' (each read proved the file's end where it reached it)."""
    failed = next((p for p in parts if isinstance(p, OSError)), None)
    if failed is not None:
        return failed
    return FileHashes(size=size, chunk_size=chunk_size, chunks=[c for p in parts for c in p])  # type: ignore[union-attr]
