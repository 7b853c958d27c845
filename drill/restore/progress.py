"""How a restore reports progress; the CLI renders it, the library only calls it."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def phase(self, name: str, total_bytes: int | None = None) -> None:
        """A new phase (``discover``, ``read``, ``load``, ``checks``) starts."""
        ...

    def advance(self, nbytes: int) -> None:
        """``nbytes`` more bytes were read; may be called from reader threads."""
        ...


class NullProgress:
    def phase(self, name: str, total_bytes: int | None = None) -> None:
        pass

    def advance(self, nbytes: int) -> None:
        pass
