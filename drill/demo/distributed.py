"""The demo run trained by N ranks on CPU: FSDP2-sharded model and optimizer, per-rank RNG and
data-loader state, saved with DCP as a genuinely sharded checkpoint (``__<rank>_<n>.distcp``).

``drill demo DIR --ranks N`` starts N processes of this module (gloo, a ``file://``
rendezvous: nothing listens on a port). Each rank trains its slice of every global batch and
logs what it saw (``drill-steps.rank<r>.jsonl``: its slice's fingerprint, its local loss);
rank 0 also logs the global loss and the global batch's fingerprint (``drill-steps.jsonl``)
and applies retention. The replay (:mod:`drill.demo.replay`) rebuilds these objects in a
process group of its own — by N ranks, or resharded by M that divide the global batch. Each
checkpoint is sealed as it is saved (``drill.sdk.save``: every rank hashes what it writes,
rank 0 writes the manifest before it commits ``.metadata``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from drill import parts
from drill.demo.config import DemoConfig

RANKS_FILE = "run.json"


def train_distributed(run_dir: str | Path, cfg: DemoConfig, ranks: int, *, timeout: float = 1800.0) -> float:
    """Train with ``ranks`` processes into ``run_dir`` (a fresh directory); returns seconds."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if any(run_dir.iterdir()):
        raise FileExistsError(f"{run_dir} is not empty; the demo writes a fresh run directory")
    if ranks < 2:
        raise ValueError("--ranks must be at least 2 for a sharded run (1 is the ordinary demo)")
    cfg.write(run_dir, ranks=ranks)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="drill-demo-rdzv-") as rdzv:
        env = {**os.environ, "DRILL_DIST_INIT": f"file://{rdzv}/store", "WORLD_SIZE": str(ranks)}
        procs = []
        for rank in range(ranks):
            log = open(Path(rdzv) / f"rank{rank}.log", "w+b")
            cmd = [sys.executable, "-m", "drill.demo.distributed", str(run_dir)]
            procs.append(
                (subprocess.Popen(cmd, env={**env, "RANK": str(rank)}, stdout=log, stderr=subprocess.STDOUT), log)
            )
        _wait_all(procs, timeout)
    return time.perf_counter() - started


def _wait_all(procs: list[tuple[subprocess.Popen, Any]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    failed: list[str] = []
    for rank, (proc, log) in enumerate(procs):
        try:
            code = proc.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            code = None
        if code != 0:
            log.seek(0)
            tail = log.read().decode(errors="replace").strip().splitlines()[-3:]
            failed.append(f"rank {rank} {'timed out' if code is None else f'exited {code}'}: {' | '.join(tail)}")
            for other, _ in procs:
                if other.poll() is None:
                    other.kill()
    for _, log in procs:
        log.close()
    if failed:
        raise RuntimeError("; ".join(failed))


# -- one rank -------------------------------------------------------------------------------
def objects(cfg: DemoConfig, rank: int, world: int, saved: int | None = None) -> dict[str, Any]:
    """The training objects of ``rank`` of ``world``; ``saved``: the ranks the run trained with
    (its global batch is ``batch_size × saved``, whatever ``world`` replays it)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from drill.demo.data import ShuffledWindowLoader, synthetic_corpus
    from drill.demo.model import TinyGPT
    from drill.demo.state import TrainState, WarmupCosine
    from drill.demo.train import seed_everything

    global_batch = cfg.batch_size * (saved or world)
    if global_batch % world:
        raise ValueError(f"a global batch of {global_batch} does not split over {world} ranks")
    seed_everything(cfg.seed)  # the same initial weights on every rank
    model = TinyGPT(cfg)
    mesh = init_device_mesh("cpu", (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(cfg.warmup_steps, cfg.steps))
    tokens = synthetic_corpus(cfg.vocab_size, cfg.corpus_tokens, cfg.seed)
    loader = ShuffledWindowLoader(tokens, cfg.block_size, global_batch, cfg.seed)
    seed_everything(cfg.seed + 1 + rank)  # each rank its own dropout stream
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler, "loader": loader, "train": TrainState()}


def step(o: dict[str, Any], rank: int, world: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """One optimizer step: (what this rank saw, the run's global view)."""
    import torch
    import torch.distributed as dist

    from drill.sdk.state import fingerprint as batch_fingerprint

    o["model"].train()
    x_all, y_all = o["loader"].next_batch()
    share = x_all.shape[0] // world
    x, y = x_all[rank * share : (rank + 1) * share], y_all[rank * share : (rank + 1) * share]
    loss = o["model"](x, y)
    o["optimizer"].zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(o["model"].parameters(), 1.0)
    lr = o["optimizer"].param_groups[0]["lr"]
    o["optimizer"].step()
    o["scheduler"].step()
    o["train"].step += 1
    o["train"].tokens_seen += x_all.numel()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    grad = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
    common = {"step": o["train"].step, "grad_norm": grad, "lr": lr, "tokens": o["train"].tokens_seen}
    mine = {**common, "loss": loss.item(), "batch": batch_fingerprint(x)}
    return mine, {**common, "loss": mean.item() / world, "batch": batch_fingerprint(x_all)}


def stateful(o: dict[str, Any], rank: int) -> dict[str, Any]:
    """What a checkpoint of this rank holds, as ``Stateful`` objects: saved from them, and a
    replay loads into them."""
    from drill.demo.state import ModelState, OptimizerState, PerRank, RNGState

    return {
        parts.MODEL: ModelState(o["model"]),
        parts.OPTIMIZER: OptimizerState(o["model"], o["optimizer"]),
        parts.LR_SCHEDULER: o["scheduler"],
        parts.DATALOADER: PerRank(o["loader"], rank),
        parts.RNG: PerRank(RNGState(), rank),
        parts.TRAIN_STATE: o["train"],
    }


def _save(o: dict[str, Any], run_dir: Path, cfg: DemoConfig, rank: int) -> None:
    import torch.distributed as dist

    from drill.demo.train import apply_retention, checkpoint_dir
    from drill.integrity.keys import load_key
    from drill.sdk.sealed import save

    path = checkpoint_dir(run_dir, o["train"].step)
    save(stateful(o, rank), str(path), key=load_key(), thread_count=1)  # every rank hashes what it writes; rank 0 seals
    if rank == 0:
        apply_retention(run_dir, cfg.keep)
    dist.barrier()


def main(run_dir: str) -> None:
    import torch.distributed as dist

    from drill.demo.train import deterministic
    from drill.runlog import StepLog

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=os.environ["DRILL_DIST_INIT"], rank=rank, world_size=world)
    path = Path(run_dir)
    cfg = DemoConfig(**json.loads((path / RANKS_FILE).read_text())["config"])
    try:
        with deterministic(cfg.threads):
            o = objects(cfg, rank, world)
            logs = [StepLog(path, rank=rank), *([StepLog(path)] if rank == 0 else [])]  # its own; the run's
            while o["train"].step < cfg.steps:
                for log, record in zip(logs, step(o, rank, world), strict=False):
                    log.append(record.pop("step"), **record)
                if o["train"].step % cfg.save_every == 0:
                    for log in logs:
                        log.sync()
                    _save(o, path, cfg, rank)
            for log in logs:
                log.close()
        dist.barrier()  # no rank tears gloo down while a peer is still talking to it
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore")
    main(sys.argv[1])
