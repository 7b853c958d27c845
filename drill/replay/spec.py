"""What a replay runs and how strictly it compares."""

from __future__ import annotations

import re
from dataclasses import dataclass

from drill.replay.compare import Tolerance

ENTRYPOINT = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
"""``package.module:function`` (or ``module:Class.method``)."""


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
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"replay steps must be an integer of at least 1, not {self.steps!r}")
        if not self.timeout > 0 or self.timeout == float("inf"):
            raise ValueError(f"replay timeout must be a positive number of seconds, not {self.timeout!r}")
        if self.entrypoint is not None and not ENTRYPOINT.match(self.entrypoint):
            raise ValueError(f"replay entrypoint {self.entrypoint!r} must be module:function, e.g. mytrainer.replay:build_replay")
