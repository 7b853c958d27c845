"""A local file's pages in the kernel's page cache: how many are there, and dropping them.

A restart after a failure reads its checkpoint cold, with every other node, from shared
storage; a drill that reads from a warm page cache measures memory, not storage. A cold drill
first writes back and drops each file's cached pages — ``posix_fadvise(POSIX_FADV_DONTNEED)``,
which needs no privilege — and says how many were resident before and after (``mincore``
over a read-only mapping). Pages another process holds mapped or locked may stay: the figures
say so rather than assume.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from collections.abc import Iterable

_PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte))
_libc.mincore.restype = ctypes.c_int


def resident_bytes(path: str) -> int:
    """Bytes of ``path`` now in the page cache (whole pages, at most its size)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    pages = (size + _PAGE - 1) // _PAGE
    vec = (ctypes.c_ubyte * pages)()
    # A private (copy-on-write) mapping: ctypes can take its address, and nothing is read or written.
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mapped:
        anchor = ctypes.c_char.from_buffer(mapped)
        try:
            if _libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), size, vec) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err), path)
        finally:
            del anchor  # the mapping cannot close while a ctypes view exports it
    return min(size, sum(v & 1 for v in vec) * _PAGE)


def drop(paths: Iterable[str]) -> None:
    """Write back and drop each file's cached pages (dirty pages cannot be dropped unwritten)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


__all__ = ["drop", "resident_bytes"]
