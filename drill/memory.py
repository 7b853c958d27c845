"""Memory a restore or a verification makes: Python's collector paused while it is made, and
a fresh target's pages faulted in ahead of the reads.

Thousands of small objects (a 20,000-file listing, its seal, a DCP index) set off Python's
cyclic collector again and again, each time walking everything already alive — torch's
modules, the listing so far: :func:`collector_paused` holds it off while they are made.

A target allocated for a restore (``torch.empty``, as at a job's start) has no pages yet. A
positioned read into it faults them in one at a time, inside the kernel's copy — on the 2-core
VM that cost more than the read itself (1.2 GB: 0.98 s into fresh targets, 0.25 s into touched
ones). One ``madvise(MADV_POPULATE_WRITE)`` (Linux 5.14+) per part of a large target, issued on
threads of the CRC lane's own while the reader fills the target before it, takes the faults off
the reader's path: 0.42 s into fresh targets (``benchmarks/limit.py``).
Populating never changes a byte, and a target already in memory (a live trainer's) costs
a walk of its page tables. Where the kernel cannot (an older one, another system) nothing is
done: the reads fault the pages in as before.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic collector off while a checkpoint's many small objects are made (its
    listing and seal, its index, one read item and target view per entry), back as it was
    after: otherwise it walks everything alive again and again — ten times the work of reading
    20,000 small entries."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


@contextmanager
def kept() -> Iterator[None]:
    """The objects made inside live until the process ends: the collector is paused while they
    are made, and — in a process drill's command line owns (:func:`drill.proc.process_claimed`),
    never a library's host — then frozen (:func:`gc.freeze`), so no later collection walks
    them again. Re-enabled, the collector would otherwise walk everything made while it was
    paused at its next allocation: a 20,000-file seal and listing, 25-35 ms of a 0.35 s
    ``drill verify``. Frozen objects still go when nothing refers to them; only cycles among
    them wait for the process's end. Elsewhere it is :func:`collector_paused`."""
    from drill.proc import process_claimed

    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if process_claimed():
            gc.freeze()
        if paused:
            gc.enable()


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_MADV_POPULATE_WRITE = 23
_WINDOW = 64 << 20
"""Bytes of a target asked about (and populated) at once: a target half touched has only its
untouched windows populated, and the residency vector stays small however large the target."""
_UNASKED: Any = object()
_libc: Any = _UNASKED
"""The C library's ``madvise`` and ``mincore``, looked up on the first :func:`populate` (ctypes
is imported only by a process that populates); None where there are none to ask."""


def _kernel() -> Any:
    global _libc
    if _libc is _UNASKED:
        _libc = None
        if sys.platform.startswith("linux"):
            import ctypes

            try:
                libc = ctypes.CDLL(None, use_errno=True)
                libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
                libc.madvise.restype = libc.mincore.restype = ctypes.c_int
                _libc = libc
            except (OSError, AttributeError):  # no C library to ask: nothing to populate with
                _libc = None
    return _libc


def populate(address: int, length: int) -> bool:
    """Fault in, writable, the whole pages of ``length`` bytes at ``address`` (the partial
    pages at either end are left to the read); whether the kernel did. A window whose pages
    are all in memory already (a live trainer's target) is left alone: one ``mincore`` asks,
    where populating it would walk and check every page again (0.3 GB: 0.2 ms, against 15-30).
    Releases the interpreter lock while the kernel works (a ctypes call)."""
    windows = _windows(address, length)
    libc = _kernel()
    if libc is None or not windows:
        return False
    done = True
    for at, n in windows:
        if _resident(libc, at, n):
            continue  # every page of the window is in memory
        done = libc.madvise(at, n, _MADV_POPULATE_WRITE) == 0 and done
    return done


def in_memory(address: int, length: int) -> bool:
    """Whether every whole page of ``length`` bytes at ``address`` is in memory already (a live
    trainer's target: nothing to populate); False where the kernel cannot say."""
    libc = _kernel()
    if libc is None:
        return False
    return all(_resident(libc, at, n) for at, n in _windows(address, length))


def _windows(address: int, length: int) -> list[tuple[int, int]]:
    """The whole pages of ``length`` bytes at ``address``, as (start, bytes) of at most
    :data:`_WINDOW` each; the partial pages at either end are not among them."""
    start = -(-address // _PAGE) * _PAGE
    end = (address + length) // _PAGE * _PAGE
    return [(at, min(_WINDOW, end - at)) for at in range(start, end, _WINDOW)]


def _resident(libc: Any, at: int, n: int) -> bool:
    """Whether every page of the window is in memory: ``mincore`` into a vector of this call's
    own (the lane's populating threads ask at once)."""
    import ctypes

    vector = ctypes.create_string_buffer(n // _PAGE)
    return libc.mincore(at, n, vector) == 0 and vector.raw.count(0) == 0


__all__ = ["in_memory", "populate"]


def physical_memory() -> int:
    """This host's physical memory in bytes (where the system cannot say: no limit)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return sys.maxsize
