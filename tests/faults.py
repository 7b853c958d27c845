"""Fault injection through a wrapping storage backend, as restic's tests do."""

from __future__ import annotations

import os
from typing import BinaryIO

from drill.storage import Entry, LocalStorage


class FaultyStorage:
    """Local storage that fails to open the files whose names are in ``unreadable``."""

    def __init__(self, unreadable: set[str]) -> None:
        self.inner = LocalStorage()
        self.unreadable = unreadable

    def list(self, uri: str) -> list[Entry]:
        return self.inner.list(uri)

    def stat(self, uri: str) -> Entry:
        return self.inner.stat(uri)

    def child(self, base: str, relative: str) -> str:
        return self.inner.child(base, relative)

    def map(self, uri: str) -> memoryview | None:
        if os.path.basename(uri) in self.unreadable:
            raise PermissionError(13, "Permission denied", uri)
        return self.inner.map(uri)

    def open(self, uri: str) -> BinaryIO:
        if os.path.basename(uri) in self.unreadable:
            raise PermissionError(13, "Permission denied", uri)
        return self.inner.open(uri)
