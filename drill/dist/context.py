"""The drill's place in a distributed job: its rank, the world, and a rank group that scales.

drill runs as every rank of a job that torchrun, srun or a Kubernetes indexed Job started; it
never launches ranks itself. The rank and world size come from the launcher's environment
(``RANK``/``WORLD_SIZE`` from torchrun or a Job, ``SLURM_PROCID``/``SLURM_NTASKS`` from srun).

drill's collectives move only small Python objects (per-rank reports, the plan, the verdict),
so they go through the rendezvous store (:mod:`~drill.dist.rendezvous`), never through a
process group: a broadcast is one key rank 0 sets, a gather one key per rank that rank 0
reads. N ranks hold N connections to the store, whatever N is. While a rank waits, it watches
the ranks it waits for (:mod:`~drill.dist.liveness`): one that dies is named within
``lost_after`` seconds, one that hangs at the rank timeout, one that never joined at the join
timeout — each with its host and pid.
"""

from __future__ import annotations

import os
import pickle
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from drill.dist.failure import RankFailure, StoreLost
from drill.dist.liveness import DEFAULT_INTERVAL, DEFAULT_LOST_AFTER, Guarded, Heartbeat, Watch, publish_failure
from drill.dist.rendezvous import INIT_ENV, attempt_prefix, open_store, store_host
from drill.errors import UsageError

DEFAULT_RANK_TIMEOUT = 600.0
FILE_STORE_RANKS = 64
"""Above this many ranks a ``file://`` rendezvous beats every ``world / 64`` seconds."""


def _is_file_store(store: Any) -> bool:
    import torch.distributed as dist

    inner = getattr(store, "underlying_store", store)
    return isinstance(inner, dist.FileStore)


def launched_world() -> tuple[int, int] | None:
    """(rank, world size) when a launcher started this process as one of several ranks."""
    env = os.environ
    for rank_var, world_var in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")):
        if env.get(world_var):
            try:
                world, rank = int(env[world_var]), int(env.get(rank_var, "0"))
            except ValueError:
                raise UsageError(
                    f"${world_var}={env[world_var]!r} / ${rank_var}={env.get(rank_var)!r}: not a rank and world size"
                ) from None
            if world > 1:
                if not 0 <= rank < world:
                    raise UsageError(f"rank {rank} is outside a world of {world}")
                return rank, world
            return None
    return None


@dataclass(slots=True)
class DistContext:
    rank: int
    world: int
    store: Guarded
    timeout: float
    """Seconds a rank may lag behind the others (and to join) before it counts as hung."""
    lost_after: float = DEFAULT_LOST_AFTER
    heartbeat: Heartbeat | None = None
    watch: Watch | None = None
    hosts_store: bool = False
    store_host: str = "rank 0"
    """Who hosts the rendezvous store, in words: ``rank 0``, ``torchrun's agent at HOST:PORT``, ``the file store at PATH``."""
    reported: bool = False
    """This rank sent its share to rank 0."""
    root_lost: str | None = None
    """Why rank 0 is gone, when this rank found it lost (its record is left to close)."""
    _calls: Counter[str] = field(default_factory=Counter)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    # -- collectives ------------------------------------------------------------------------
    def broadcast(self, obj: Any, stage: str) -> Any:
        """``obj`` from rank 0, on every rank; :class:`RankFailure` naming rank 0 if it is lost."""
        key = self._key(stage)
        if self.is_root:
            self.store.set(key, pickle.dumps(obj))
            return obj
        self._await([0], key, stage)
        assert self.watch is not None
        self.watch.describe(0)  # rank 0 is known from now on, even should the store go away with it
        return pickle.loads(self.store.get(key))  # trusted: written by rank 0 of this very attempt

    def scatter(self, objs: Iterable[Any] | None, stage: str) -> Any:
        """Rank 0's ``objs[r]`` on rank ``r``, each rank reading only its own: the traffic out of
        the store is the sum of the items, not the world times all of them. ``objs`` may be made
        as it is sent (a generator): rank 0 then holds one item at a time."""
        key = self._key(stage)
        if self.is_root:
            assert objs is not None
            items = iter(objs)
            first = next(items)
            sent = 0
            for sent, obj in enumerate(items, start=1):
                self.store.set(f"{key}/{sent}", pickle.dumps(obj))
            assert sent == self.world - 1, (sent, self.world)
            self.store.set(f"{key}/all", "1")
            return first
        self._await([0], f"{key}/all", stage)
        return pickle.loads(self.store.get(f"{key}/{self.rank}"))  # trusted: written by rank 0 of this very attempt

    def gather(self, obj: Any, stage: str) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0 (None elsewhere); names the ranks that never sent."""
        key = self._key(stage)
        if not self.is_root:
            self.store.set(f"{key}/{self.rank}", pickle.dumps(obj))
            self.reported = True
            if int(self.store.add(f"{key}/count", 1)) == self.world - 1:
                self.store.set(f"{key}/all", "1")
            return None
        if self.world > 1:
            self._await(
                list(range(1, self.world)), f"{key}/all", stage, arrived=lambda r: self.store.check([f"{key}/{r}"])
            )
        others = self.store.multi_get([f"{key}/{r}" for r in range(1, self.world)]) if self.world > 1 else []
        return [obj, *(pickle.loads(v) for v in others)]  # trusted: written by the ranks of this very attempt

    def _key(self, stage: str) -> str:
        self._calls[stage] += 1
        return f"{stage}#{self._calls[stage]}"

    def _await(self, ranks: list[int], key: str, stage: str, arrived: Any = None) -> None:
        """Until ``key`` is set; :class:`RankFailure` as soon as one of ``ranks`` is lost or
        failed, when they have not all arrived within the rank timeout, or when the store is gone."""
        try:
            self._await_ranks(ranks, key, stage, arrived)
        except StoreLost as gone:
            raise self._store_gone(stage, gone) from None

    def _await_ranks(self, ranks: list[int], key: str, stage: str, arrived: Any) -> None:
        assert self.watch is not None
        poll = timedelta(seconds=min(0.5, self.watch_interval / 2))
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                self.store.wait([key], poll)
                return
            except TimeoutError:
                pass
            waiting = [r for r in ranks if arrived is None or not arrived(r)] if time.monotonic() > deadline else ranks
            lost = self.watch.lost(ranks, stage)
            if arrived is not None and lost:
                lost = [(r, why) for r, why in lost if not arrived(r)]
            if lost:
                if lost[0][0] == 0 and not self.is_root:
                    self.root_lost = lost[0][1]
                shown = "; ".join(why for _, why in lost[:20]) + (
                    f"; and {len(lost) - 20} more ranks" if len(lost) > 20 else ""
                )
                raise RankFailure(shown, [r for r, _ in lost])
            if time.monotonic() > deadline:
                who = "; ".join(f"{self.watch.describe(r)} last reached '{self.watch.at(r)}'" for r in waiting[:20])
                raise RankFailure(
                    f"{_ranks(waiting)} did not reach '{stage}' within {self.timeout:g} s, though alive (hung): {who}",
                    waiting,
                )

    @property
    def watch_interval(self) -> float:
        return self.heartbeat.interval if self.heartbeat is not None else DEFAULT_INTERVAL

    def _store_gone(self, stage: str, lost: StoreLost) -> RankFailure:
        """The store went away under this rank: its host is gone. When rank 0 hosted it, rank 0
        was lost; when torchrun's agent did, the agent was — and rank 0, if it lives, records it."""
        if self.store_host == "rank 0":
            self.root_lost = "the rendezvous store it hosted went away"
            return RankFailure(f"rank 0 was lost while this rank waited at '{stage}': {self.root_lost}", [0])
        if not self.is_root and self.watch is not None and self.watch.casualties([0], 0.0):
            self.root_lost = f"it died, and {self.store_host} went away with the rendezvous store"
        return RankFailure(f"{lost.message} while this rank waited at '{stage}'", [])

    def casualties(self, ranks: list[int] | None = None) -> list[tuple[int, str]]:
        """The ranks (all the others by default) that died or failed — not those stopped by the
        same signal as this one — looking for at most a few heartbeats; [] when the store is gone."""
        assert self.watch is not None
        others = [r for r in (range(self.world) if ranks is None else ranks) if r != self.rank]
        window = min(10.0, max(2.0, 3 * self.watch_interval))
        try:
            return self.watch.casualties(others, window)
        except Exception:  # noqa: BLE001 - the store is gone: nothing more can be learnt through it
            return []

    def reached(self, stage: str) -> None:
        """Say which of the drill's stages this rank is in (what the others name should it die
        or hang there)."""
        self.store.set(f"at/{self.rank}", stage)

    # -- the verdict, and a rank's failure --------------------------------------------------
    def publish(self, key: str, value: Any) -> None:
        self.store.set(f"published/{key}", pickle.dumps(value))

    def wait_for(self, key: str, timeout: float) -> Any:
        """A value rank 0 published; :class:`RankFailure` when rank 0 is lost or silent past ``timeout``."""
        saved, self.timeout = self.timeout, timeout
        try:
            self._await([0], f"published/{key}", key)
        finally:
            self.timeout = saved
        return pickle.loads(self.store.get(f"published/{key}"))  # trusted: written by rank 0 of this very attempt

    def fail(self, cause: str, *, signalled: bool = False) -> None:
        """This rank stops early: the ranks waiting for it hear why at once (``signalled``: a
        signal stopped it — it did not fail)."""
        publish_failure(self.store, self.rank, cause, signalled=signalled)

    def close(self) -> None:
        """Leave the group. Rank 0, when it hosts the store, stays until every rank still
        alive has read the verdict (a lost one is not waited for)."""
        self.timeout = min(self.timeout, 60.0)
        try:
            if self.hosts_store or not self.is_root:
                self.gather(None, "done")
        except Exception:  # noqa: BLE001 - leaving: a lost rank or a gone store changes nothing now
            pass
        if self.heartbeat is not None:
            self.heartbeat.stop()


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:20])) + (f" and {len(ranks) - 20} more" if len(ranks) > 20 else "")
    return f"rank {shown}" if len(ranks) == 1 else f"ranks {shown}"


def connect(
    rank_timeout: float = DEFAULT_RANK_TIMEOUT,
    *,
    lost_after: float = DEFAULT_LOST_AFTER,
    interval: float | None = None,
    announce: bool = True,
) -> DistContext | None:
    """Join the job this process is a rank of; None for a single-process drill.

    When the process group of a trainer that embeds drill already exists, drill meets in its
    store (under a key space of its own); otherwise in the rendezvous the launcher names.
    ``announce=False`` only looks: no heartbeat, so the others never count this rank as joined."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if dist.get_world_size() <= 1:
            return None
        from torch.distributed.distributed_c10d import _get_default_store

        rank, world, hosts = dist.get_rank(), dist.get_world_size(), False
        store = dist.PrefixStore(attempt_prefix() + "embedded/", _get_default_store())
    else:
        launched = launched_world()
        if launched is None:
            return None
        rank, world = launched
        store, hosts = open_store(rank, world, rank_timeout)
    interval = interval or min(DEFAULT_INTERVAL, lost_after / 5)
    if _is_file_store(store) and world > FILE_STORE_RANKS:
        # Every FileStore operation reads what every rank appended since: N ranks beating every
        # second read O(N²) bytes a second from the shared filesystem. Beat less often, and allow
        # a lost rank as many missed beats as before (env:// — a TCPStore — has no such cost).
        interval = max(interval, world / FILE_STORE_RANKS)
        lost_after = max(lost_after, 5 * interval)
    guarded = Guarded(store, store_host())
    ctx = DistContext(rank, world, guarded, rank_timeout, lost_after, hosts_store=hosts, store_host=guarded.host)
    ctx.heartbeat = Heartbeat(guarded, rank, interval) if announce else None
    ctx.watch = Watch(guarded, world, lost_after, rank_timeout)
    return ctx


def casualties_before_joining(rank_timeout: float, lost_after: float) -> list[tuple[int, str]]:
    """The ranks that died or failed, asked by a rank a signal stopped before it joined — a
    launcher ends the whole job when one rank dies, and a slow rank may hear of it first. Looks
    for at most ~10 s without joining; [] when the rendezvous cannot be reached or this rank was
    to host it (then nobody else could have joined)."""
    try:
        ctx = connect(min(rank_timeout, 10.0), lost_after=lost_after, announce=False)
    except Exception:  # noqa: BLE001 - nothing more can be learnt
        return []
    if ctx is None or ctx.hosts_store:
        return []
    return ctx.casualties()


__all__ = [
    "DEFAULT_RANK_TIMEOUT",
    "INIT_ENV",
    "DistContext",
    "RankFailure",
    "casualties_before_joining",
    "connect",
    "launched_world",
]
