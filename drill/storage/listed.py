"""A storage that lists each directory once for the span of one command.

``drill verify`` asks what a path is (which lists it) and then plans the proof of its files
(which lists it again): on a checkpoint of 20,000 files that is 20,000 ``stat`` calls paid
twice. Wrapped in :class:`ListedOnce`, the second listing is the first one's. Nothing that is
read is cached — opening, resolving and hashing go to the storage itself — and the proof still
compares every file's size as it reads it, so a file that changes after the listing is found.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from typing import Any

from drill.storage.base import CacheState, Entry, Listing, Storage


class ListedOnce:
    """``inner``, with :meth:`list` answered once per directory — the same
    :class:`~drill.storage.Listing` each time, so its index of names is built once however
    many formats ask (a listing is never changed once made)."""

    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.positioned_reads = inner.positioned_reads
        self._listed: dict[str, Listing] = {}
        self._seeds: dict[str, Callable[[], list[Entry] | None]] = {}

    def seed(self, uri: str, listing: Callable[[], list[Entry] | None]) -> None:
        """Take what ``listing`` returns, asked when ``uri`` is first listed here, as its
        listing: a listing made elsewhere (in a forked child while the seal was parsed,
        :mod:`drill.storage.apart`); the storage lists it where that returns None."""
        self._seeds[uri] = listing

    def list(self, uri: str) -> list[Entry]:
        listed = self._listed.get(uri)
        if listed is None:
            seed = self._seeds.pop(uri, None)
            entries = seed() if seed is not None else None
            listed = self._listed[uri] = Listing.of(entries if entries is not None else self.inner.list(uri))
        return listed

    def stat(self, uri: str) -> Entry:
        return self.inner.stat(uri)

    def open(self, uri: str) -> io.RawIOBase:
        return self.inner.open(uri)

    def child(self, base: str, relative: str) -> str:
        return self.inner.child(base, relative)

    def open_below(self, base: str, relative: str) -> tuple[io.RawIOBase, int]:
        return self.inner.open_below(base, relative)

    def write(self, uri: str, data: bytes, *, replace: bool = False) -> None:
        self._listed.clear()  # a written file is in the next listing
        self._seeds.clear()
        self.inner.write(uri, data, replace=replace)

    def normalize(self, uri: str) -> str:
        return self.inner.normalize(uri)

    def cached(self, sizes: Mapping[str, int]) -> CacheState:
        return self.inner.cached(sizes)

    def evict(self, sizes: Mapping[str, int]) -> CacheState:
        return self.inner.evict(sizes)

    def __getattr__(self, name: str) -> Any:  # what a storage offers beyond the protocol (open_fd)
        return getattr(self.inner, name)


__all__ = ["ListedOnce"]
