"""One rank of a 2-rank resume through ``drill.sdk.load`` (resharding a 1-rank demo checkpoint
onto FSDP2-sharded model and optimizer), compared with ``dcp.load`` of the same checkpoint.

    python -m tests.support.sdk_ranks CHECKPOINT OUT_JSON      (RANK, WORLD_SIZE, DRILL_DIST_INIT)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def main(checkpoint: str, out: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    import drill.sdk
    from drill.demo.config import DemoConfig
    from drill.demo.distributed import objects

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=os.environ["DRILL_DIST_INIT"], rank=rank, world_size=world)
    cfg = DemoConfig(**json.loads((Path(checkpoint).parent / "run.json").read_text())["config"])
    o = objects(cfg, rank, world)
    ours = {
        "model": get_model_state_dict(o["model"]),
        "optimizer": get_optimizer_state_dict(o["model"], o["optimizer"]),
    }
    result: dict = {"rank": rank}
    try:
        report = drill.sdk.load(ours, checkpoint, record=rank == 0, db=os.environ.get("DRILL_DB"))
        result.update(ok=True, ranks=report.ranks, sealed=report.sealed)
    except drill.sdk.CheckpointCorrupt as exc:
        result.update(ok=False, error=str(exc), file=exc.file, ranges=exc.byte_ranges)
    if result["ok"]:
        theirs = {"model": {k: torch.zeros_like(v) for k, v in ours["model"].items()}}
        dcp.load(theirs, checkpoint_id=checkpoint)
        same = all(torch.equal(ours["model"][k].to_local(), theirs["model"][k].to_local()) for k in ours["model"])
        result["same_as_dcp_load"] = same
    dist.barrier()
    dist.destroy_process_group()
    out.write_text(json.dumps(result))


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore")
    main(sys.argv[1], Path(sys.argv[2]))
    import atexit

    atexit._run_exitfuncs()  # drill's own at-exit work first: the resume record rank 0 spools
    sys.stdout.flush()
    # No interpreter teardown: gloo's threads torn down at exit can abort the process
    # ("terminate called without an active exception") after the rank's result is written.
    os._exit(0)
