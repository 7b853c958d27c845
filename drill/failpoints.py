"""Failpoints: named places where a test makes a process fail the way real ones do.

``$DRILL_FAILPOINTS`` holds ``name=action`` pairs separated by commas, optionally for one
rank: ``restored@1=kill`` kills rank 1 (SIGKILL) just before it reports its restore,
``restored@1=hang`` stops it there for good, ``migrated=term`` sends the process SIGTERM there (as a launcher would), ``restored=hold`` parks every rank there until
the file ``$DRILL_FAILPOINTS_RELEASE`` exists (each leaves ``<that file>.<rank>`` on arrival,
so a test can act while all of them are parked), ``restored@1:0=kill`` acts on attempt 0 of a
restarted job only (``$TORCHELASTIC_RESTART_COUNT``, a requeued Slurm job's ``$SLURM_RESTART_COUNT``). Unset — always, outside tests — every
failpoint is one dictionary lookup that does nothing. (Like etcd's gofail or TiKV's fail-rs.)
"""

from __future__ import annotations

import os
import signal
import time

ENV = "DRILL_FAILPOINTS"
RELEASE_ENV = "DRILL_FAILPOINTS_RELEASE"


def _rank() -> str:
    return os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or "0"


def _armed(name: str) -> str | None:
    spec = os.environ.get(ENV)
    if not spec:
        return None
    env = os.environ
    rank, attempt = _rank(), env.get("TORCHELASTIC_RESTART_COUNT") or env.get("SLURM_RESTART_COUNT") or "0"
    for pair in spec.split(","):
        where, _, action = pair.strip().partition("=")
        point, _, only = where.partition("@")
        only, _, on_attempt = only.partition(":")
        if point == name and (not only or only == rank) and (not on_attempt or on_attempt == attempt):
            return action
    return None


def failpoint(name: str) -> None:
    action = _armed(name)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "hang":
        while True:
            time.sleep(3600)
    elif action == "hold":
        release = os.environ[RELEASE_ENV]
        open(f"{release}.{_rank()}", "w").close()
        while not os.path.exists(release):
            time.sleep(0.05)
    elif action == "raise":
        raise RuntimeError(f"failpoint {name}")
    elif action == "term":
        os.kill(os.getpid(), signal.SIGTERM)


__all__ = ["ENV", "RELEASE_ENV", "failpoint"]
