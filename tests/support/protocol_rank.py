"""One rank of the protocol test (tests/test_protocol.py): it joins the job through the store
the launcher names, takes its plan exactly as a distributed restore does
(:func:`drill.formats.dcp_shard.receive_plan`: rank 0 reads and hashes ``.metadata``, assigns
the files and sends each rank its part), and reports what it received and its peak memory to
rank 0, which writes every rank's figures to the JSON file named on the command line."""

from __future__ import annotations

import json
import pickle
import sys
import time

import torch


def main(checkpoint: str, out: str) -> None:
    from drill.checkpoints import CheckpointRef
    from drill.dist.context import connect
    from drill.formats.base import RestoreContext
    from drill.formats.dcp_read import DrillReader
    from drill.formats.dcp_shard import receive_plan
    from drill.restore import RestoreResult
    from drill.restore.partition import Shard
    from drill.storage import storage_for

    baseline = _peak()
    dist = connect(900.0, lost_after=300.0)  # a loaded machine: nothing here may be taken for a lost rank
    assert dist is not None
    storage = storage_for(checkpoint)
    ref = CheckpointRef(uri=checkpoint, name="step-1", step=1, format="dcp", mtime=0.0)
    result = RestoreResult(uri=checkpoint, format="dcp", device="cpu", index_file=".metadata")
    reader = DrillReader(storage, checkpoint, result, RestoreContext(device=torch.device("cpu")))
    shard = Shard(dist.rank, dist.world, lambda objs: dist.scatter(objs, "index"))
    started, sent = time.perf_counter(), dist.store.sent
    plan = receive_plan(storage, ref, reader, shard)
    seconds, sent = time.perf_counter() - started, dist.store.sent - sent
    assert plan[0] == "ok", plan
    mine = {
        "rank": dist.rank,
        "entries": len(plan[1].storage_data),
        "plan_bytes": len(pickle.dumps(plan)),
        "seconds": seconds,
        "sent_bytes": sent,
        "baseline_rss": baseline,
        "peak_rss": _peak(),
    }
    del plan
    reports = dist.gather(mine, "figures")
    if reports is not None:
        with open(out, "w") as f:
            json.dump(reports, f)
    dist.close()


def _peak() -> int:
    """This process's peak resident memory, in bytes (``VmHWM``: unlike ``ru_maxrss``, not
    inherited from the process that forked this one)."""
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM:")).split()[1]) * 1024


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
