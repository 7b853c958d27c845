"""A rank that died, hung, never joined or failed its share: the drill ends as an ``error``."""

from __future__ import annotations

from drill.errors import DrillError, ExitCode


class RankFailure(DrillError):
    """The message names each rank, its host and what happened to it; ``ranks`` lists them."""

    exit_code = ExitCode.ERROR

    def __init__(self, message: str, ranks: list[int]) -> None:
        super().__init__(message)
        self.ranks = ranks


class StoreLost(RankFailure):
    """The rendezvous store stopped answering: its host (rank 0, or torchrun's agent) is gone."""

    def __init__(self, host: str, cause: BaseException) -> None:
        first = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:200]
        super().__init__(f"the rendezvous store went away: {host} hosting it died or was stopped ({first})", [])
        self.host = host


__all__ = ["RankFailure", "StoreLost"]
