"""What a replay runs and how strictly it compares."""

from __future__ import annotations

from dataclasses import dataclass

from drill.replay.compare import Tolerance


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplaySpec:
    entrypoint: str | None = None
    """``module:function`` building the training objects; None: the run's own (the demo's), if known."""
    steps: int = 5
    """K: optimizer steps to replay after the checkpoint."""
    tolerance: Tolerance | None = None
    """None: exact on the same device type as the original run, loose across device types."""
    timeout: float = 300.0
    """Wall-clock seconds for the whole replay (child start, restore, K steps)."""
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError("replay steps must be at least 1")
        if self.timeout <= 0:
            raise ValueError("replay timeout must be positive")
        if self.entrypoint is not None and ":" not in self.entrypoint:
            raise ValueError(f"replay entrypoint {self.entrypoint!r} must be module:function")
