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

from drill.dist.failure import StoreLost

DEFAULT_INTERVAL = 1.0
DEFAULT_LOST_AFTER = 15.0
_FIRST_PAUSE, _LAST_PAUSE = 0.001, 0.05
"""How long a wait on the store sleeps between checks: a collective that is ready at once
costs a millisecond, one that waits is seen within 50 ms."""


class Guarded:
    """The store behind one lock: the heartbeat thread and the drill share a connection. Any
    failure of the store itself is :class:`~drill.dist.failure.StoreLost` naming its ``host``
    (c10d's own errors carry C++ stack traces)."""

    def __init__(self, store: Any, host: str = "rank 0") -> None:
        self.store = store
        self.host = host
        self.lock = threading.Lock()
        self.sent = 0
        """Bytes of the values this process has set in the store (what it sent through it)."""

    def set(self, key: str, value: str | bytes) -> None:
        self.sent += len(value)
        self.__getattr__("set")(key, value)

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        """Until every key is set, or :class:`TimeoutError` after ``timeout``. Never one
        blocking wait under the lock: a rank waiting at a collective would hold it for the whole
        wait, again and again, and starve its own heartbeat thread — its waiters would then find
        it lost while it waits for someone else. Checks under the lock, sleeps outside it."""
        deadline = time.monotonic() + timeout.total_seconds()
        pause = _FIRST_PAUSE
        while True:
            if self.check(keys):
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
                try:
                    return op(*args)
                except Exception as exc:  # noqa: BLE001 - a store that fails is a store that is gone
                    raise StoreLost(self.host, exc) from None

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
    known: dict[int, tuple[str, str]] = field(default_factory=dict)
    """(host, pid) of each rank as it announced itself: still known once the store is gone."""

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
        if rank not in self.known:
            try:
                if not self.store.check([f"who/{rank}"]):
                    return None
                host, _, pid = self.store.get(f"who/{rank}").decode(errors="replace").partition(" ")
            except Exception:  # noqa: BLE001 - the store is gone: what this rank knew is all there is
                return None
            self.known[rank] = (host, pid)
        return self.known[rank]

    def casualties(self, ranks: list[int], window: float) -> list[tuple[int, str]]:
        """Each of ``ranks`` that died or failed, as opposed to one stopped by the same signal as
        this rank — what a launcher's SIGTERM does not say. A rank that said a signal stopped it is
        alive; one that published its failure failed; one on this host whose process is gone died;
        one elsewhere whose heartbeat does not move within ``window`` seconds died (a rank alive
        beats every interval, whatever it is doing). A rank that never announced itself is not
        judged here."""
        found: list[tuple[int, str]] = []
        remote: dict[int, tuple[str, str]] = {}
        try:
            failed: bool | None = int(self.store.add("failed", 0)) > 0
        except StoreLost:
            failed = None  # the store is gone: only what this host can see of its own ranks
        for r in ranks:
            if failed and self.store.check([f"fail/{r}"]):
                if not self.store.check([f"sig/{r}"]):
                    cause = self.store.get(f"fail/{r}").decode(errors="replace")
                    found.append((r, f"{self.describe(r)} failed at '{self.at(r)}': {cause}"))
                continue
            who = self.known.get(r) if failed is None else self._who(r)
            if who is None:
                continue
            if who[0] == socket.gethostname() and who[1].isdigit():
                if not _alive(int(who[1])):
                    found.append(
                        (r, f"{self.describe(r)} died at '{self.at(r)}' (its process is gone: killed or crashed)")
                    )
            elif failed is not None:
                remote[r] = who
        return found + self._silent(remote, window)

    def _silent(self, ranks: dict[int, tuple[str, str]], window: float) -> list[tuple[int, str]]:
        """The ranks on other hosts whose heartbeat did not move within ``window`` seconds."""
        if not ranks:
            return []
        keys = [f"hb/{r}" for r in ranks]
        first = dict(zip(ranks, self.store.multi_get(keys), strict=True))
        deadline, still = time.monotonic() + window, set(ranks)
        while still and time.monotonic() < deadline:
            time.sleep(min(0.2, window / 10))
            now = dict(zip(ranks, self.store.multi_get(keys), strict=True))
            still = {r for r in still if now[r] == first[r]}
        return [
            (
                r,
                f"{self.describe(r)} died at '{self.at(r)}': no heartbeat for {window:g} s (killed, crashed, or its node was lost)",
            )
            for r in sorted(still)
        ]

    def at(self, rank: int) -> str:
        """The last stage ``rank`` said it reached."""
        try:
            return (
                self.store.get(f"at/{rank}").decode(errors="replace")
                if self.store.check([f"at/{rank}"])
                else "(nothing)"
            )
        except StoreLost:
            return "(unknown: the store is gone)"

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


def publish_failure(store: Guarded, rank: int, cause: str, *, signalled: bool = False) -> None:
    """Tell the waiting ranks at once why this rank stops (best effort: the store may be gone);
    ``signalled``: a signal stopped it, it did not fail (see :meth:`Watch.casualties`)."""
    try:
        if signalled:
            store.set(f"sig/{rank}", "1")
        store.set(f"fail/{rank}", cause[:500])
        store.add("failed", 1)
    except Exception:  # noqa: BLE001 - the heartbeat's silence will tell them instead
        pass


__all__ = ["DEFAULT_INTERVAL", "DEFAULT_LOST_AFTER", "Guarded", "Heartbeat", "Watch", "publish_failure"]
