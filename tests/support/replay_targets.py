"""Replay entrypoints for the tests: the demo's, and ones that fail on purpose."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from drill.demo.replay import DemoReplay, build_replay


class _Raising(DemoReplay):
    def step(self) -> Any:
        raise RuntimeError("the step function exploded")


REPLAYING = "DRILL_TEST_REPLAYING"
"""A file the hanging replay creates once it is in its step (the test waits on it, not a clock)."""


class _Hanging(DemoReplay):
    def step(self) -> Any:
        if os.environ.get(REPLAYING):
            Path(os.environ[REPLAYING]).touch()
        time.sleep(3600)


def raising(*, run_dir: str, checkpoint: str, device: torch.device) -> DemoReplay:
    return _Raising(build_replay(run_dir=run_dir, checkpoint=checkpoint, device=device).objs)


def hanging(*, run_dir: str, checkpoint: str, device: torch.device) -> DemoReplay:
    return _Hanging(build_replay(run_dir=run_dir, checkpoint=checkpoint, device=device).objs)


class _NaNLoss(DemoReplay):
    def step(self) -> Any:
        record = super().step()
        return type(record)(step=record.step, loss=float("nan"), grad_norm=float("inf"), batch=record.batch)


def nan_loss(*, run_dir: str, checkpoint: str, device: torch.device) -> DemoReplay:
    """A replay whose losses come out NaN (and grad norms infinite): a diverged run."""
    return _NaNLoss(build_replay(run_dir=run_dir, checkpoint=checkpoint, device=device).objs)
