"""A complete trainer that drill can drill: every part of the state a resume needs is saved
(sealed as it is written), every step is logged, and a replay entrypoint (replay.py) rebuilds
the same objects. It uses only public drill names: ``drill.sdk``.

    python examples/my_trainer/trainer.py ./my-run               # train 40 steps, save every 10
    drill run --root ./my-run --replay examples/my_trainer/replay.py:build_replay

docs/my-trainer.md walks through it.
"""

from __future__ import annotations

import argparse
import json
import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

import drill.sdk
from drill.sdk import ModelState, OptimizerState, RNGState, StepLog, StepRecord, TrainState, fingerprint

SEED = 1234
THREADS = 1  # torch CPU threads: the replay uses the same count (bit-for-bit sums)


class ShuffledLoader:
    """Batches of a fixed dataset in a seeded, per-epoch shuffled order. Its state holds the
    position *and* what decides the order (seed, epoch): a position alone would resume on a
    differently shuffled stream (drill's ``dataloader-position-only``)."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int, seed: int) -> None:
        self.inputs, self.targets, self.batch_size, self.seed = inputs, targets, batch_size, seed
        self.epoch, self.position = 0, 0

    def _order(self) -> torch.Tensor:
        return torch.randperm(len(self.inputs), generator=torch.Generator().manual_seed(self.seed + self.epoch))

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.position + self.batch_size > len(self.inputs):
            self.epoch, self.position = self.epoch + 1, 0
        picks = self._order()[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return self.inputs[picks], self.targets[picks]

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed, self.epoch, self.position = int(state["seed"]), int(state["epoch"]), int(state["position"])


class Training:
    """Everything a step touches, built the same way for training and for a replay."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        random.seed(SEED)
        np.random.seed(SEED)
        torch.manual_seed(SEED)
        data = torch.Generator().manual_seed(SEED)
        inputs = torch.randn(512, 16, generator=data)
        targets = inputs @ torch.randn(16, 1, generator=data) + 0.1 * torch.randn(512, 1, generator=data)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 1)
        ).to(self.device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=15, gamma=0.5)
        self.loader = ShuffledLoader(inputs, targets, batch_size=32, seed=SEED)
        self.train_state = TrainState()

    def stateful(self) -> dict[str, Any]:
        """What is saved and what a resume (or a replay) loads: one entry per part."""
        return {
            "model": ModelState(self.model),
            "optimizer": OptimizerState(self.model, self.optimizer),
            "lr_scheduler": self.scheduler,
            "dataloader": self.loader,
            "rng": RNGState(),
            "train_state": self.train_state,
        }

    def step(self) -> StepRecord:
        """One optimizer step (dropout draws from the RNG, so the RNG state matters)."""
        self.model.train()
        x, y = self.loader.next_batch()
        batch = fingerprint(x)
        loss = torch.nn.functional.mse_loss(self.model(x.to(self.device)), y.to(self.device))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.scheduler.step()
        self.train_state.step += 1
        self.train_state.tokens_seen += len(x)
        return StepRecord(step=self.train_state.step, loss=loss.item(), grad_norm=grad_norm.item(), batch=batch)


def train(run_dir: Path, steps: int = 40, save_every: int = 10) -> list[float]:
    """Train into ``run_dir``: a sealed checkpoint every ``save_every`` steps, every step logged."""
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    run_dir.mkdir(parents=True, exist_ok=True)
    # What a replay compares against: the device type (exact comparison on the same one).
    (run_dir / "run.json").write_text(json.dumps({"device": "cpu"}))
    training, losses = Training(), []
    with StepLog(run_dir) as log:
        while training.train_state.step < steps:
            record = training.step()
            log.append(record.step, loss=record.loss, grad_norm=record.grad_norm, batch=record.batch)
            losses.append(record.loss)
            if record.step % save_every == 0:
                log.sync()  # the log reaches past every checkpoint it will be compared with
                with warnings.catch_warnings():  # one process, no process group: DCP says so each time
                    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
                    drill.sdk.save(
                        training.stateful(), checkpoint_id=str(run_dir / f"step-{record.step}"), no_dist=True
                    )
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description="Train the example model into RUN_DIR.")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--save-every", type=int, default=10)
    args = parser.parse_args()
    losses = train(args.run_dir, args.steps, args.save_every)
    print(f"trained {len(losses)} steps into {args.run_dir}: loss {losses[0]:.4f} → {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
