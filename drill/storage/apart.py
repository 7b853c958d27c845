"""A directory listed in a forked process while this one does other work.

Listing a checkpoint of 20,000 files is 20,000 ``stat`` calls — as long, in the process that
verifies it, as parsing the seal that follows (on the 2-core VM 45 and 40 ms), and the other
core waits idle through both. :func:`list_apart` forks a child that lists the directory and
sends the entries back through a pipe (``marshal``: a few milliseconds to read 20,000 entries
back, against the ``stat`` calls' 45), so the listing runs beside the parsing.

Only a process drill's command line owns forks (:func:`drill.proc.may_fork`), and only for a
directory whose own size says it holds thousands of entries (a listing of a few costs less
than the fork). The child lists and nothing else: it opens no file, and dies with its parent.
A child that fails, dies or sends something short leaves :meth:`Apart.entries` None, and the
caller lists the directory itself, as without it.
"""

from __future__ import annotations

import marshal
import os
import struct
from array import array
from collections.abc import Callable
from itertools import repeat
from typing import Any

from drill.proc import reap
from drill.storage.base import Entry, EntryKind

MANY_ENTRIES = 64 << 10
"""A directory whose own size is at least this (bytes of directory entries: some 1,500 names
on ext4, 3,000 on tmpfs) is listed apart; a smaller one is listed in place."""


class Apart:
    """A listing being made in a forked child: :meth:`first` waits for what the child was asked
    to send before it (once), :meth:`entries` for the listing (once); :meth:`stop` kills a
    child still listing."""

    def __init__(self, pid: int, fd: int, most: int, first: bool) -> None:
        self._pid, self._fd, self._most = pid, fd, most
        self._entries: list[Entry] | None = None
        self._done = False
        self._first_pending = first

    def first(self) -> tuple[bool, Any]:
        """Whether the child sent what it was asked to send first (:func:`list_apart`'s
        ``first``), and that: ``(False, None)`` where it died before, or it was not asked."""
        if not self._first_pending or self._done:
            return False, None
        self._first_pending = False
        try:
            head = _read_exactly(self._fd, _FRAME.size)
            return True, marshal.loads(_read_exactly(self._fd, _FRAME.unpack(head)[0]))
        except (EOFError, ValueError, TypeError, OSError):  # died before it sent it
            self.stop()
            return False, None

    def entries(self) -> list[Entry] | None:
        """The directory's entries as the storage lists them (sorted by name); None where the
        child could not say (the caller lists it itself), or held more than ``most``."""
        if self._first_pending:
            self.first()
        if not self._done:
            self._done = True
            try:
                self._entries = _entries(_read_all(self._fd), self._most)
            finally:
                self.stop()
        return self._entries

    def stop(self) -> None:
        """Close the pipe and reap the child, killing it if it still lists (the entries, not
        asked for yet, are then None)."""
        self._done = True
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)
        pid, self._pid = self._pid, 0
        if pid:
            reap([pid])


def list_apart(storage: Any, uri: str, most: int, first: Callable[[], Any] | None = None) -> Apart | None:
    """The directory ``uri`` (local: ``storage.list`` in a child) being listed apart; None
    where it is listed in place: a directory of a few entries, anything but a directory, a
    process that may not fork. ``first``, called in the child before it lists, is sent ahead
    of the listing (:meth:`Apart.first`: a value ``marshal`` takes; a set is best sent as a
    list, since ``marshal`` sorts a set's members: 47 ms for 20,000 names, against 3) — a
    question about the directory its caller needs answered sooner than the whole listing."""
    from drill.proc import death_signal, die_with_parent, may_fork, write_all

    try:
        entry = storage.stat(uri)
    except OSError:  # not there, not reachable: the listing in place says which
        return None
    if not entry.is_dir or entry.size < MANY_ENTRIES or not may_fork():
        return None
    death_signal()  # resolved before the fork: the child imports nothing
    parent = os.getpid()
    read_fd, write_fd = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        return None
    if pid == 0:  # pragma: no cover - the child; what it sends is checked by the parent
        os.close(read_fd)
        code = 1
        try:
            die_with_parent(parent)
            if first is not None:
                sent = marshal.dumps(first())
                write_all(write_fd, _FRAME.pack(len(sent)) + sent)
            entries = storage.list(uri)
            if len(entries) <= most:
                write_all(write_fd, _encoded(entries))
                code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    return Apart(pid, read_fd, most, first is not None)


_FRAME = struct.Struct("<Q")
"""The length of what the child sends first, ahead of it."""


def _read_exactly(fd: int, n: int) -> bytes:
    parts, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("the child ended before it sent it")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _read_all(fd: int) -> bytes:
    parts = []
    while chunk := os.read(fd, 1 << 20):
        parts.append(chunk)
    return b"".join(parts)


_CODE = {k: i for i, k in enumerate(EntryKind)}
_KINDS = list(EntryKind)


def _encoded(entries: list[Entry]) -> bytes:  # pragma: no cover - in the child
    """The entries as a few flat arrays: names and paths ``NUL``-joined (no name holds one),
    kinds as bytes, sizes and times as machine arrays, link targets by index. Marshalled
    tuple by tuple, 20,000 entries took 14 ms to write and 11-17 to read back."""
    return marshal.dumps(
        (
            len(entries),
            "\0".join(e[0] for e in entries).encode("utf-8", "surrogateescape"),
            "\0".join(e[1] for e in entries).encode("utf-8", "surrogateescape"),
            bytes(_CODE[e[2]] for e in entries),
            array("q", [e[3] for e in entries]).tobytes(),
            array("d", [e[4] for e in entries]).tobytes(),
            {i: e[5] for i, e in enumerate(entries) if e[5] is not None},
        )
    )


def _entries(data: bytes, most: int) -> list[Entry] | None:
    """The entries the child sent; None for anything but a complete, well-formed listing."""
    try:
        count, names, uris, kinds, sizes, times, links = marshal.loads(data)
        if not count:
            return []
        if count > most:
            return None
        size_of, time_of = array("q"), array("d")
        size_of.frombytes(sizes)
        time_of.frombytes(times)
        names_of = names.decode("utf-8", "surrogateescape").split("\0")
        uris_of = uris.decode("utf-8", "surrogateescape").split("\0")
        if not len(names_of) == len(uris_of) == len(kinds) == len(size_of) == len(time_of) == count:
            return None
        kind_of = [_KINDS[k] for k in kinds]
        rows = zip(names_of, uris_of, kind_of, size_of.tolist(), time_of.tolist(), repeat(None))
        entries = list(map(tuple.__new__, repeat(Entry), rows))  # Entries without their constructor
        for i, target in links.items():
            entries[i] = entries[i]._replace(link_target=target)
    except (EOFError, ValueError, TypeError, IndexError, AttributeError):  # a child that died mid-write
        return None
    return entries


__all__ = ["MANY_ENTRIES", "Apart", "list_apart"]
