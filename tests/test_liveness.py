"""The store a distributed drill's ranks share, behind one lock (drill.dist.liveness.Guarded):
a rank's own waiting must leave its heartbeat thread room to beat, or the ranks waiting for it
find it lost while it is only waiting for another (seen at 32 ranks on a loaded machine: rank 1
closed rank 0's record as lost while rank 0 was finding rank 7 lost)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch.distributed as dist

from drill.dist.liveness import Guarded, Heartbeat


def test_a_rank_waiting_at_a_collective_keeps_beating() -> None:
    """One wait of a second (a rank waits in slices of up to half its heartbeat interval, and
    was starved for as long as each slice lasted): the heartbeat goes on beating through it."""
    store = Guarded(dist.HashStore())
    beat = Heartbeat(store, rank=0, interval=0.01)
    try:
        before = int(store.add("hb/0", 0))
        with pytest.raises(TimeoutError):
            store.wait(["never-set"], timedelta(seconds=1))
        beats = int(store.add("hb/0", 0)) - before
    finally:
        beat.stop()
    assert beats >= 10, f"{beats} heartbeats in 1 s of waiting, at an interval of 10 ms"


def test_a_wait_returns_once_every_key_is_set_and_times_out_otherwise() -> None:
    store = Guarded(dist.HashStore())
    store.set("a", "1")
    setter = threading.Thread(target=store.set, args=("b", "1"))
    setter.start()
    store.wait(["a", "b"], timedelta(seconds=60))  # returns as soon as the other thread has set b
    setter.join()
    with pytest.raises(TimeoutError, match="waited 0.01 s for a, c"):
        store.wait(["a", "c"], timedelta(seconds=0.01))
