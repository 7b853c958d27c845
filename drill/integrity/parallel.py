"""Hashing a checkpoint's files on every core this process may use.

A local file is cut into spans of whole chunks, so one big shard does not hash on one core.
Where this process may fork, the spans are hashed through mappings in forked workers
(:mod:`drill.integrity.mapped`, twice the bytes per core); what they leave — a span whose
mapping faulted, everything where forking is not safe — is read with positioned reads on
threads. Object storage streams each file (its reader reads ahead by itself), as does a file
that needs SHA-256 besides.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from drill.integrity.hashing import FileHashes
from drill.integrity.reading import FileChanged, hash_span, hash_stream
from drill.storage import Storage

T = TypeVar("T")
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
    uris = {rel: storage.child(checkpoint, rel) for rel in spans}
    done: Digests = dict(_hash_mapped(storage, uris, spans, chunk_size, workers))
    streamed = [rel for rel in paths if rel not in spans]
    left = [(rel, a, n) for rel, parts in spans.items() for a, n in parts if (rel, a) not in done]
    out: dict[str, FileHashes | OSError] = {}
    if streamed or left:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=workers) as pool:
            whole = {
                rel: pool.submit(
                    _caught,
                    hash_stream,
                    storage,
                    storage.child(checkpoint, rel),
                    sizes[rel],
                    chunk_size=chunk_size,
                    sha256=rel in sha256,
                )
                for rel in streamed
            }
            read = {
                (rel, a): pool.submit(_caught, hash_span, storage, uris[rel], a, n, chunk_size) for rel, a, n in left
            }
            out.update((rel, f.result()) for rel, f in whole.items())
            done.update((key, f.result()) for key, f in read.items())
    for rel, parts in spans.items():
        out[rel] = _joined(storage, uris[rel], sizes[rel], chunk_size, [done[(rel, a)] for a, _ in parts])
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
    chunks = -(-size // chunk)
    per = max(1, min(-(-chunks // max(1, parts)), SPAN_BYTES // chunk))
    return [(i * chunk, min(size, (i + per) * chunk) - i * chunk) for i in range(0, chunks, per)]


def _hash_mapped(
    storage: Storage, uris: Mapping[str, str], spans: Spans, chunk_size: int, workers: int
) -> dict[tuple[str, int], list[bytes]]:
    """The spans forked workers hashed through mappings; none where this process may not fork."""
    from drill.proc import may_fork

    if not spans or not may_fork():
        return {}
    from drill.integrity.mapped import hash_mapped

    keys = [(rel, a, n) for rel, parts in spans.items() for a, n in parts]
    open_fd = storage.open_fd  # type: ignore[attr-defined]  # a storage with positioned reads (local) offers it
    got = hash_mapped(open_fd, [(uris[rel], a, n) for rel, a, n in keys], chunk_size, workers)
    return {(rel, a): digests for (rel, a, _), digests in zip(keys, got, strict=True) if digests is not None}


def _caught(read: Callable[..., T], *args: Any, **kwargs: Any) -> T | OSError:
    """What ``read`` returns, or the error that stopped it (a file that changed size included)."""
    try:
        return read(*args, **kwargs)
    except FileChanged as exc:
        return OSError(0, str(exc))
    except OSError as exc:
        return exc


def _joined(
    storage: Storage, uri: str, size: int, chunk_size: int, parts: list[list[bytes] | OSError]
) -> FileHashes | OSError:
    """One file's hashes from its spans'; the file's size checked again, as a streamed read
    would notice it grow."""
    failed = next((p for p in parts if isinstance(p, OSError)), None)
    if failed is not None:
        return failed
    try:
        now = storage.stat(uri).size
    except OSError as exc:
        return exc
    if now != size:
        return OSError(0, f"file is {now} bytes by the end of the read, {size} when listed")
    return FileHashes(size=size, chunk_size=chunk_size, chunks=[c for p in parts for c in p])  # type: ignore[union-attr]
