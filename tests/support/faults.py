"""Fault injection through a wrapping storage backend, as restic's tests do.

Faults strike *during* the read, where real storage fails: a bit flips in flight, the file
is truncated or grows under the reader (another writer re-saving into the directory), an
I/O error comes after some bytes — once (a retry succeeds) or every time.
"""

from __future__ import annotations

import errno
import io
import os
from dataclasses import dataclass
from typing import Any, BinaryIO

from drill.storage import Entry, LocalStorage


@dataclass
class Flip:
    """XOR one byte at ``offset`` as it is read (the file on disk is untouched)."""

    offset: int
    mask: int = 0x01


@dataclass
class Truncate:
    """The file ends at ``at`` bytes from the reader's point of view (it shrank mid-read)."""

    at: int


@dataclass
class Grow:
    """``extra`` bytes appear past the size the file had when listed."""

    extra: int = 1


@dataclass
class Fail:
    """An I/O error once ``at`` bytes were read; the first ``times`` opens fail (None: all)."""

    at: int = 0
    code: int = errno.EIO
    times: int | None = None


@dataclass
class Hang:
    """The read never returns (a hung mount) — until ``release`` is set."""

    release: Any = None


Fault = Flip | Truncate | Grow | Fail | Hang | str
"""``"deny"``: the open itself is refused (permission denied)."""


class _FaultyReader(io.RawIOBase):
    def __init__(self, inner: BinaryIO, fault: Fault) -> None:
        super().__init__()
        self.inner = inner
        self.fault = fault
        self.pos = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        view = memoryview(b).cast("B")
        f = self.fault
        if isinstance(f, Hang):
            f.release.wait(120)
        if isinstance(f, Truncate):
            view = view[: max(0, f.at - self.pos)]
        if isinstance(f, Fail) and self.pos + len(view) > f.at:
            if self.pos >= f.at:
                raise OSError(f.code, os.strerror(f.code))
            view = view[: f.at - self.pos]
        n = self.inner.readinto(view)
        if not n and isinstance(f, Grow) and f.extra:
            n, f.extra = min(f.extra, len(view)), 0
            view[:n] = b"\0" * n
        if isinstance(f, Flip) and self.pos <= f.offset < self.pos + n:
            view[f.offset - self.pos] ^= f.mask
        self.pos += n
        return n

    def close(self) -> None:
        self.inner.close()
        super().close()


class FaultyStorage(LocalStorage):
    """Local storage with a fault per file name."""

    def __init__(self, faults: dict[str, Fault]) -> None:
        self.faults = faults
        self.opens: dict[str, int] = {}

    def open(self, uri: str) -> BinaryIO:
        return self._faulty(uri, lambda: super(FaultyStorage, self).open(uri))

    def open_below(self, base: str, relative: str) -> tuple[BinaryIO, int]:
        sized: list[int] = []

        def opened() -> BinaryIO:
            f, size = super(FaultyStorage, self).open_below(base, relative)
            sized.append(size)
            return f

        f = self._faulty(relative, opened)
        return f, sized[0]

    def _faulty(self, uri: str, opened) -> BinaryIO:
        name = os.path.basename(uri)
        fault = self.faults.get(name)
        self.opens[name] = self.opens.get(name, 0) + 1
        if fault == "deny":
            raise PermissionError(13, "Permission denied", uri)
        inner = opened()
        if fault is None or (isinstance(fault, Fail) and fault.times is not None and self.opens[name] > fault.times):
            return inner
        return _FaultyReader(inner, fault)

    def list(self, uri: str) -> list[Entry]:
        return super().list(uri)
