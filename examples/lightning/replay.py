"""The replay entrypoint of a Lightning run: Lightning resumes from the checkpoint
(``trainer.fit(..., ckpt_path=...)``) into the run's own LightningModule, built from the
hyper-parameters the checkpoint saved; the module's class and the data are yours to give.

    drill run --root ./pl-run --replay examples/lightning/replay.py:build_replay
"""

from __future__ import annotations

from typing import Any

from model import Regression, train_loader  # a sibling file: drill imports this one from where it lies

from drill.integrations.lightning import LightningReplay, lightning_replay


def build_replay(*, run_dir: str, checkpoint: str, device: Any) -> LightningReplay:
    return lightning_replay(checkpoint, device, module=Regression, train_dataloaders=train_loader())
