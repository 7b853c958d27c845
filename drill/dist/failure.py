"""A rank that died, hung, never joined or failed its share: the drill ends as an ``error``."""

from __future__ import annotations

from drill.errors import DrillError, ExitCode


class RankFailure(DrillError):
    """The message names each rank, its host and what happened to it; ``ranks`` lists them."""

    exit_code = ExitCode.ERROR

    def __init__(self, message: str, ranks: list[int]) -> None:
        super().__init__(message)
        self.ranks = ranks


__all__ = ["RankFailure"]
