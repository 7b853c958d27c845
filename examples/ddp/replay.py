"""The DDP trainer's replay entrypoint. drill starts as many processes as saved the checkpoint,
each a rank of a process group of its own (gloo on CPU), and calls this in each: the same
objects the trainer built, which drill loads the checkpoint into and steps.

    drill run --root ./ddp-run --replay examples/ddp/replay.py:build_replay
"""

from __future__ import annotations

import torch
from trainer import THREADS, Training  # a sibling file: drill imports this one from where it lies


class Replay(Training):
    threads = THREADS


def build_replay(*, run_dir: str, checkpoint: str, device: torch.device) -> Replay:
    return Replay()
