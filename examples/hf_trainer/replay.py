"""The replay entrypoint of a Hugging Face ``Trainer`` run: the Trainer resumes from the
checkpoint with the run's own ``TrainingArguments`` (read from ``training_args.bin``) and the
model class its ``config.json`` names; only the dataset is yours to give.

    drill run --root ./hf-run --replay examples/hf_trainer/replay.py:build_replay
"""

from __future__ import annotations

from typing import Any

from data import train_dataset  # a sibling file: drill imports this one from where it lies

from drill.integrations.hf import TrainerReplay, trainer_replay


def build_replay(*, run_dir: str, checkpoint: str, device: Any) -> TrainerReplay:
    return trainer_replay(checkpoint, device, train_dataset=train_dataset())
