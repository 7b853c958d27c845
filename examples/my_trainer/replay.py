"""The replay entrypoint of the example trainer: fresh training objects, which drill loads the
checkpoint into (``stateful()``) and steps (``step()``) to compare with the run's step log.

    drill run --root ./my-run --replay examples/my_trainer/replay.py:build_replay
"""

from __future__ import annotations

import torch
from trainer import THREADS, Training  # a sibling file: drill imports this one from where it lies


class Replay(Training):
    threads = THREADS  # the thread count the run trained with


def build_replay(*, run_dir: str, checkpoint: str, device: torch.device) -> Replay:
    return Replay(device)
