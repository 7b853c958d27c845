"""Which ranks are alive, through the store: heartbeats out, and a watch that names the lost.

Each rank announces itself once (``who/<rank>``: host and pid) and then bumps its heartbeat
counter (``hb/<rank>``) every ``interval`` seconds from a daemon thread. A rank that waits for
others watches them: a rank whose counter has not moved for ``lost_after`` seconds is lost (a
SIGKILL, a segfault, a node that vanished without a reset) — found in ``lost_after`` plus one
interval, not at the rank timeout; a rank that published a failure (``fail/<rank>``) is named
at once; a rank that never announced itself within the join timeout never joined. Reading every
heartbeat is one ``multi_get``: the watch costs O(1) round trips however many ranks there are.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

DEFAULT_INTERVAL = 1.0
DEFAULT_LOST_AFTER = 15.0
_FIRST_PAUSE, _LAST_PAUSE = 0.001, 0.05
"""How long a wait on the store sleeps between checks: a collective that is ready at once
costs a millisecond, one that waits is seen within 50 ms."""


class Guarded:
    """The store behind one lock: the heartbeat thread and the drill share a connection."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.lock = threading.Lock()

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        """Until every key is set, or :class:`TimeoutError` after ``timeout``. Never one
        blocking wait under the lock: a rank waiting at a collective would hold it for the whole
        wait, again and again, and starve its own heartbeat thread — its waiters would then find
        it lost while it waits for someone else. Checks under the lock, sleeps outside it."""
        deadline = time.monotonic() + timeout.total_seconds()
        pause = _FIRST_PAUSE
        while True:
            with self.lock:
                if self.store.check(keys):
                    return
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"waited {timeout.total_seconds():g} s for {', '.join(keys)}")
            time.sleep(min(pause, left))
            pause = min(pause * 2, _LAST_PAUSE)

    def __getattr__(self, name: str) -> Any:
        op = getattr(self.store, name)

        def locked(*args: Any) -> Any:
            with self.lock:
                return op(*args)

        return locked


class Heartbeat:
    """Announce this rank, then beat until :meth:`stop` (or until the store goes away)."""

    def __init__(self, store: Guarded, rank: int, interval: float) -> None:
        self.store, self.rank, self.interval = store, rank, interval
        self._stop = threading.Event()
        store.set(f"who/{rank}", f"{socket.gethostname()} {os.getpid()}")
        store.add(f"hb/{rank}", 1)
        store.add("joined", 1)
        self._thread = threading.Thread(target=self._run, name=f"drill-heartbeat-{rank}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.store.add(f"hb/{self.rank}", 1)
            except Exception:  # noqa: BLE001 - the store's host is gone: the waiters will say so
                return

    def stop(self) -> None:
        self._stop.set()


@dataclass(slots=True)
class Watch:
    """What this rank has seen of the others: each counter and when it last moved."""

    store: Guarded
    world: int
    lost_after: float
    join_timeout: float
    started: float = field(default_factory=time.monotonic)
    seen: dict[int, tuple[bytes, float]] = field(default_factory=dict)

    def lost(self, ranks: list[int], stage: str) -> list[tuple[int, str]]:
        """Each of ``ranks`` that failed, died or never joined, with what happened to it
        while this rank waited at ``stage``."""
        now = time.monotonic()
        found = self._failed(ranks, stage)
        if found:
            return found
        joined = (
            [r for r in ranks if self.store.check([f"who/{r}"])]
            if int(self.store.add("joined", 0)) < self.world
            else ranks
        )
        if now - self.started > self.join_timeout:
            found += [
                (
                    r,
                    f"rank {r} never joined: no sign of it {self.join_timeout:g} s after this rank joined (not started, or it failed before joining)",
                )
                for r in ranks
                if r not in joined
            ]
        if not joined:
            return found
        beats = self.store.multi_get([f"hb/{r}" for r in joined])
        for r, beat in zip(joined, beats, strict=True):
            count, since = self.seen.get(r, (b"", now))
            if beat != count:
                self.seen[r] = (beat, now)
            elif now - since > self.lost_after:
                host, pid = self._who(r) or ("?", "")
                found.append(
                    (
                        r,
                        f"rank {r} on {host} (pid {pid}) was lost at '{stage}': no heartbeat for {now - since:.1f} s{_how_gone(host, pid)}",
                    )
                )
        return found

    def _failed(self, ranks: list[int], stage: str) -> list[tuple[int, str]]:
        if int(self.store.add("failed", 0)) == 0:
            return []
        return [
            (r, f"{self.describe(r)} stopped before '{stage}': {self.store.get(f'fail/{r}').decode(errors='replace')}")
            for r in ranks
            if self.store.check([f"fail/{r}"])
        ]

    def _who(self, rank: int) -> tuple[str, str] | None:
        """(host, pid) as the rank announced itself; None before it did."""
        if not self.store.check([f"who/{rank}"]):
            return None
        host, _, pid = self.store.get(f"who/{rank}").decode(errors="replace").partition(" ")
        return host, pid

    def describe(self, rank: int) -> str:
        """``rank 1 on node7 (pid 4242)``, as far as it announced itself."""
        who = self._who(rank)
        return f"rank {rank}" if who is None else f"rank {rank} on {who[0]} (pid {who[1]})"


def _how_gone(host: str, pid: str) -> str:
    """What this host can tell of a silent rank: its process gone, or alive but silent (on this
    host only); elsewhere, what silence means."""
    if host != socket.gethostname() or not pid.isdigit():
        return " (killed, crashed, or its node was lost)"
    return (
        " (its process is gone: killed or crashed)"
        if not _alive(int(pid))
        else " (its process is alive but silent: stopped or starved)"
    )


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def publish_failure(store: Guarded, rank: int, cause: str) -> None:
    """Tell the waiting ranks at once why this rank stops (best effort: the store may be gone)."""
    try:
        store.set(f"fail/{rank}", cause[:500])
        store.add("failed", 1)
    except Exception:  # noqa: BLE001 - the heartbeat's silence will tell them instead
        pass


__all__ = ["DEFAULT_INTERVAL", "DEFAULT_LOST_AFTER", "Guarded", "Heartbeat", "Watch", "publish_failure"]
