"""A data-parallel trainer (DDP over gloo, CPU) that drill replays by as many ranks: each rank
trains its slice of every global batch, keeps its own step log and its own data-loader
position and RNG streams in the checkpoint; rank 0 also logs the run's global loss.

    torchrun --nproc-per-node 2 examples/ddp/trainer.py ./ddp-run    # 30 steps, a save every 10
    drill run --root ./ddp-run --replay examples/ddp/replay.py:build_replay

Each rank's replay is compared with that rank's own log (``drill-steps.rank<r>.jsonl``), the
run's view with the run's (``drill-steps.jsonl``). docs/replay.md walks through it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import drill.sdk
from drill.sdk import ModelState, OptimizerState, PerRank, RNGState, StepLog, StepRecord, TrainState, fingerprint

SEED = 1234
THREADS = 1
GLOBAL_BATCH = 32


class GlobalBatches:
    """The same seeded, per-epoch shuffled stream of global batches on every rank; its state
    holds what decides the order (seed, epoch) beside the position."""

    def __init__(self, size: int, batch: int, seed: int) -> None:
        self.size, self.batch, self.seed, self.epoch, self.position = size, batch, seed, 0, 0

    def next_indices(self) -> torch.Tensor:
        if self.position + self.batch > self.size:
            self.epoch, self.position = self.epoch + 1, 0
        order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        self.position += self.batch
        return order[self.position - self.batch : self.position]

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed, self.epoch, self.position = int(state["seed"]), int(state["epoch"]), int(state["position"])


class Training:
    """One rank's training objects, built the same way to train and to replay."""

    def __init__(self) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        random.seed(SEED)
        np.random.seed(SEED)
        torch.manual_seed(SEED)  # the same initial weights on every rank
        data = torch.Generator().manual_seed(SEED)
        self.inputs = torch.randn(512, 16, generator=data)
        self.targets = self.inputs @ torch.randn(16, 1, generator=data) + 0.1 * torch.randn(512, 1, generator=data)
        net = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 1)
        )
        self.model = DistributedDataParallel(net)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=15, gamma=0.5)
        self.loader = GlobalBatches(len(self.inputs), GLOBAL_BATCH, SEED)
        self.train_state = TrainState()
        torch.manual_seed(SEED + 1 + self.rank)  # each rank its own dropout stream

    def stateful(self) -> dict[str, Any]:
        return {
            "model": ModelState(self.model),
            "optimizer": OptimizerState(self.model, self.optimizer),
            "lr_scheduler": self.scheduler,
            "dataloader": PerRank(self.loader, self.rank),
            "rng": PerRank(RNGState(), self.rank),
            "train_state": self.train_state,
        }

    def step(self) -> tuple[StepRecord, StepRecord]:
        """One optimizer step: (what this rank saw, the run's global view)."""
        self.model.train()
        picks = self.loader.next_indices()
        share = len(picks) // self.world
        mine = picks[self.rank * share : (self.rank + 1) * share]
        loss = torch.nn.functional.mse_loss(self.model(self.inputs[mine]), self.targets[mine])
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP averages the gradients over the ranks
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0))
        self.optimizer.step()
        self.scheduler.step()
        self.train_state.step += 1
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        step = self.train_state.step
        return (
            StepRecord(step=step, loss=loss.item(), grad_norm=grad_norm, batch=fingerprint(mine)),
            StepRecord(step=step, loss=mean.item() / self.world, grad_norm=grad_norm, batch=fingerprint(picks)),
        )


def train(run_dir: Path, steps: int, save_every: int) -> None:
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    training = Training()
    rank = training.rank
    if rank == 0:
        (run_dir / "run.json").write_text(json.dumps({"device": "cpu", "ranks": training.world}))
    logs = [StepLog(run_dir, rank=rank), *([StepLog(run_dir)] if rank == 0 else [])]  # its own; the run's
    while training.train_state.step < steps:
        for log, record in zip(logs, training.step(), strict=False):
            log.append(record.step, loss=record.loss, grad_norm=record.grad_norm, batch=record.batch)
        if training.train_state.step % save_every == 0:
            for log in logs:
                log.sync()
            drill.sdk.save(training.stateful(), checkpoint_id=str(run_dir / f"step-{training.train_state.step}"))
    for log in logs:
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--save-every", type=int, default=10)
    args = parser.parse_args()
    args.run_dir.mkdir(parents=True, exist_ok=True)
    # torchrun sets the rendezvous (env://); a shared file works too: INIT_METHOD=file:///path
    init = os.environ.get("INIT_METHOD", "env://")
    if init == "env://":
        dist.init_process_group("gloo")
    else:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=UserWarning)
            train(args.run_dir, args.steps, args.save_every)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
