"""The demo training loop: build the objects, step, save DCP checkpoints, apply retention.

``build`` and ``train_step`` are the parts a replay reuses: restoring a checkpoint into the
objects ``build`` returns and calling ``train_step`` must reproduce what the run logged.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from drill import parts
from drill.checkpoints import step_of
from drill.demo.config import DemoConfig
from drill.demo.data import ShuffledWindowLoader, synthetic_corpus
from drill.demo.model import TinyGPT
from drill.demo.state import ModelState, OptimizerState, RNGState, TrainState, WarmupCosine
from drill.integrity.keys import load_key
from drill.runlog import StepLog, StepRecord
from drill.sdk.state import fingerprint as batch_fingerprint


@dataclass(slots=True)
class TrainingObjects:
    cfg: DemoConfig
    device: torch.device
    model: TinyGPT
    optimizer: torch.optim.AdamW
    lr_scheduler: torch.optim.lr_scheduler.LambdaLR
    dataloader: ShuffledWindowLoader
    train_state: TrainState

    def stateful(self) -> dict[str, Any]:
        """The state a checkpoint holds, keyed by the canonical part names."""
        return {
            parts.MODEL: ModelState(self.model),
            parts.OPTIMIZER: OptimizerState(self.model, self.optimizer),
            parts.LR_SCHEDULER: self.lr_scheduler,
            parts.DATALOADER: self.dataloader,
            parts.RNG: RNGState(),
            parts.TRAIN_STATE: self.train_state,
        }


@dataclass(slots=True)
class DemoRunResult:
    run_dir: Path
    losses: list[float] = field(default_factory=list)
    saved: list[int] = field(default_factory=list)
    """Steps at which a checkpoint was written."""
    retained: list[int] = field(default_factory=list)
    """Steps whose checkpoints survive retention."""
    seconds: float = 0.0


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@contextlib.contextmanager
def deterministic(threads: int) -> Iterator[None]:
    """Pin the thread count and deterministic kernels for the duration, then put them back."""
    prev_threads = torch.get_num_threads()
    prev_det = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(prev_threads)
        torch.use_deterministic_algorithms(prev_det)


def build(cfg: DemoConfig, device: torch.device | str = "cpu") -> TrainingObjects:
    """Fresh training objects for ``cfg`` on ``device``: the same code trains and restores."""
    device = torch.device(device)
    seed_everything(cfg.seed)
    model = TinyGPT(cfg).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(cfg.warmup_steps, cfg.steps))
    tokens = synthetic_corpus(cfg.vocab_size, cfg.corpus_tokens, cfg.seed)
    loader = ShuffledWindowLoader(tokens, cfg.block_size, cfg.batch_size, cfg.seed)
    return TrainingObjects(cfg, device, model, optimizer, scheduler, loader, TrainState())


def train_step(objs: TrainingObjects) -> StepRecord:
    """One optimizer step; returns what the step log records for it."""
    objs.model.train()
    x, y = objs.dataloader.next_batch()
    fingerprint = batch_fingerprint(x)
    x, y = x.to(objs.device), y.to(objs.device)
    loss = objs.model(x, y)
    objs.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(objs.model.parameters(), 1.0)
    lr = objs.optimizer.param_groups[0]["lr"]
    objs.optimizer.step()
    objs.lr_scheduler.step()
    objs.train_state.step += 1
    objs.train_state.tokens_seen += x.numel()
    return StepRecord(
        step=objs.train_state.step,
        loss=loss.item(),
        grad_norm=grad_norm.item(),
        batch=fingerprint,
        lr=lr,
        tokens=objs.train_state.tokens_seen,
    )


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / f"step-{step}"


def save_checkpoint(objs: TrainingObjects, run_dir: Path) -> Path:
    """Sealed as it is written (drill.sdk.save): keyed when $DRILL_SEAL_KEY_FILE names a key."""
    from drill.sdk.sealed import save

    path = checkpoint_dir(run_dir, objs.train_state.step)
    # Two writer threads give two shard files per rank, as a real multi-threaded save does.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        save(objs.stateful(), str(path), key=load_key(), no_dist=True, thread_count=2)
    return path


def apply_retention(run_dir: Path, keep: int) -> list[int]:
    """Delete all but the newest ``keep`` checkpoints; returns the retained steps."""
    steps = sorted(s for p in run_dir.iterdir() if p.is_dir() and (s := step_of(p.name)) is not None)
    for step in steps[:-keep]:
        shutil.rmtree(checkpoint_dir(run_dir, step))
    return steps[-keep:]


def train(
    run_dir: str | Path,
    cfg: DemoConfig | None = None,
    on_step: Callable[[StepRecord], None] | None = None,
) -> DemoRunResult:
    """Train the demo model into ``run_dir`` (created; must not hold another run)."""
    cfg = cfg or DemoConfig()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if any(run_dir.iterdir()):
        raise FileExistsError(f"{run_dir} is not empty; the demo writes a fresh run directory")
    cfg.write(run_dir)
    result = DemoRunResult(run_dir)
    started = time.perf_counter()
    with deterministic(cfg.threads):
        objs = build(cfg)
        with StepLog(run_dir) as log:
            while objs.train_state.step < cfg.steps:
                record = train_step(objs)
                log.append(
                    record.step,
                    loss=record.loss,
                    grad_norm=record.grad_norm,
                    batch=record.batch,
                    lr=record.lr,
                    tokens=record.tokens,
                )
                result.losses.append(record.loss)
                if on_step is not None:
                    on_step(record)
                if record.step % cfg.save_every == 0:
                    log.sync()
                    save_checkpoint(objs, run_dir)
                    result.saved.append(record.step)
                    result.retained = apply_retention(run_dir, cfg.keep)
    result.seconds = time.perf_counter() - started
    return result
