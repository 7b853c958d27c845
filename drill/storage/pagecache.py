"""A local file's pages in the kernel's page cache: how many are there, and dropping them.

A restart after a failure reads its checkpoint cold, with every other node, from shared
storage; a drill that reads from a warm page cache measures memory, not storage. A cold drill
first writes back and drops each file's cached pages — ``posix_fadvise(POSIX_FADV_DONTNEED)``,
which needs no privilege — and says how many are resident, counted by the ``cachestat``
system call (Linux 6.5+): no mapping of the file, so nothing a truncation could turn into a
SIGBUS. On an older kernel the count is unknown (None), never guessed. Pages another process
holds mapped or locked may stay: the figures say so rather than assume.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Iterable

_PAGE = os.sysconf("SC_PAGE_SIZE")
_CACHESTAT = 451  # the same number on every architecture (a syscall added after the tables were unified)


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Stat(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")
    ]


_libc = ctypes.CDLL(None, use_errno=True)


def resident_bytes(path: str) -> int | None:
    """Bytes of ``path`` now in the page cache (whole pages, at most its size); None when this
    kernel cannot say (no ``cachestat``)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        stat = _Stat()
        if _libc.syscall(_CACHESTAT, fd, ctypes.byref(_Range(0, 0)), ctypes.byref(stat), 0) != 0:
            err = ctypes.get_errno()
            if err in (errno.ENOSYS, errno.EPERM, errno.EOPNOTSUPP):
                return None
            raise OSError(err, os.strerror(err), path)
        return min(size, stat.nr_cache * _PAGE)
    finally:
        os.close(fd)


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
