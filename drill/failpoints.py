"""Failpoints: named places where a test makes a process fail the way real ones do.

``$DRILL_FAILPOINTS`` holds ``name=action`` pairs separated by commas, optionally for one
rank: ``restored@1=kill`` kills rank 1 (SIGKILL) just before it reports its restore,
``restored@1=hang`` stops it there for good. Unset — always, outside tests — every
failpoint is one dictionary lookup that does nothing. (Like etcd's gofail or TiKV's fail-rs.)
"""

from __future__ import annotations

import os
import signal
import time

ENV = "DRILL_FAILPOINTS"


def _armed(name: str) -> str | None:
    spec = os.environ.get(ENV)
    if not spec:
        return None
    rank = os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or "0"
    for pair in spec.split(","):
        where, _, action = pair.strip().partition("=")
        point, _, only = where.partition("@")
        if point == name and (not only or only == rank):
            return action
    return None


def failpoint(name: str) -> None:
    action = _armed(name)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "hang":
        while True:
            time.sleep(3600)
    elif action == "raise":
        raise RuntimeError(f"failpoint {name}")


__all__ = ["ENV", "failpoint"]
