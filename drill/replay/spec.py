"""What a replay runs and how strictly it compares."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from drill.replay.compare import Tolerance

ENTRYPOINT = re.compile(r"^([A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*|[^:]+\.py):[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*\Z")
"""``package.module:function`` (or ``module:Class.method``), or ``path/to/file.py:function``:
a file named directly, imported from where it lies (no ``PYTHONPATH`` needed)."""


def entrypoint_file(entrypoint: str) -> str | None:
    """The file of a ``path/to/file.py:function`` entrypoint; None for ``module:function``."""
    module = entrypoint.rpartition(":")[0]
    return module if module.endswith(".py") else None


def anchored(entrypoint: str, base: str) -> str:
    """A file entrypoint with a relative path made absolute against ``base`` (the working
    directory for ``--replay``, the policy file's directory for a policy); others unchanged."""
    path = entrypoint_file(entrypoint)
    if path is None or os.path.isabs(path):
        return entrypoint
    return f"{os.path.normpath(os.path.join(base, path))}:{entrypoint.rpartition(':')[2]}"


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
    python: str | None = None
    """A candidate environment's interpreter the replay runs under (None: drill's own)."""
    ranks: int | None = None
    """Processes that replay; None: as many as saved the checkpoint. Another number reshards
    (compared with the run's global view)."""

    def __post_init__(self) -> None:
        if self.ranks is not None and (
            isinstance(self.ranks, bool) or not isinstance(self.ranks, int) or self.ranks < 1
        ):
            raise ValueError(f"replay ranks must be an integer of at least 1, not {self.ranks!r}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"replay steps must be an integer of at least 1, not {self.steps!r}")
        if not self.timeout > 0 or self.timeout == float("inf"):
            raise ValueError(f"replay timeout must be a positive number of seconds, not {self.timeout!r}")
        if self.entrypoint is not None and not ENTRYPOINT.match(self.entrypoint):
            raise ValueError(
                f"replay entrypoint {self.entrypoint!r} must be module:function or path/to/file.py:function, e.g. mytrainer.replay:build_replay"
            )
