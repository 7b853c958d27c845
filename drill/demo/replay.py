"""The demo run's replay entrypoint: the worked example of drill's replay protocol."""

from __future__ import annotations

from typing import Any

import torch

from drill.demo.config import DemoConfig
from drill.demo.train import TrainingObjects, build, train_step
from drill.runlog.steplog import StepRecord


class DemoReplay:
    """Fresh training objects of the demo run; drill loads the checkpoint into them."""

    def __init__(self, objs: TrainingObjects) -> None:
        self.objs = objs
        self.threads = objs.cfg.threads

    def stateful(self) -> dict[str, Any]:
        return self.objs.stateful()

    def step(self) -> StepRecord:
        return train_step(self.objs)


def build_replay(*, run_dir: str, checkpoint: str, device: torch.device) -> DemoReplay:
    return DemoReplay(build(DemoConfig.read(run_dir), device))
