"""The demo run's replay entrypoint: the worked example of drill's replay protocol.

A run trained by one process replays in one (:class:`DemoReplay`); a run sharded over N ranks
(``drill demo --ranks N``) replays in the process group drill starts for it — by N ranks, each
compared with its own step log, or resharded by M (:class:`ShardedDemoReplay`)."""

from __future__ import annotations

from typing import Any

import torch

from drill import safe_json
from drill.demo.config import RUN_FILE, DemoConfig
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


class ShardedDemoReplay:
    """One rank of the sharded demo's replay: FSDP2 over the replay's process group."""

    def __init__(self, cfg: DemoConfig, saved: int) -> None:
        import torch.distributed as dist

        from drill.demo.distributed import objects

        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.objs = objects(cfg, self.rank, self.world, saved)
        self.threads = cfg.threads

    def stateful(self) -> dict[str, Any]:
        from drill.demo.distributed import stateful

        return stateful(self.objs, self.rank)

    def step(self) -> tuple[StepRecord, StepRecord]:
        from drill.demo.distributed import step

        mine, run = step(self.objs, self.rank, self.world)
        return StepRecord(**mine), StepRecord(**run)


def build_replay(*, run_dir: str, checkpoint: str, device: torch.device) -> DemoReplay | ShardedDemoReplay:
    import torch.distributed as dist

    from drill.runlog.runfiles import read_run_file

    cfg = DemoConfig.read(run_dir)
    saved = safe_json.loads(read_run_file(str(run_dir), RUN_FILE)).get("ranks", 1)
    if dist.is_initialized():  # drill replays a sharded run in a process group, even of one
        return ShardedDemoReplay(cfg, saved)
    return DemoReplay(build(cfg, device))
