"""transformers' ``Trainer``: every ``checkpoint-N`` sealed right after it is saved.

The Trainer writes its checkpoints through ``torch.save`` and safetensors, which drill cannot
wrap; so :class:`DrillSealCallback` seals each one in ``on_save``, on every rank at once: each
hashes its share of the files (balanced by bytes) and rank 0 writes ``drill-manifest.json``
(:func:`~drill.integrity.sealing.seal_across_ranks`). Then ``drill run``, ``drill verify`` and
``drill.sdk.load`` prove every byte of it, and the keyed seal authenticates it.

    from drill.integrations.hf import DrillSealCallback
    trainer = Trainer(..., callbacks=[DrillSealCallback(key=drill.sdk.load_key())])
"""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from drill.integrity.sealing import SealReport, seal_across_ranks


class DrillSealCallback(TrainerCallback):  # type: ignore[misc]
    """Seal each ``checkpoint-N`` in ``on_save``; :attr:`reports` keeps what each seal cost."""

    def __init__(self, key: bytes | None = None) -> None:
        self.key = key
        self.reports: list[SealReport] = []

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        checkpoint = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if os.path.isdir(checkpoint):
            self.reports.append(seal_across_ranks(checkpoint, key=self.key))


__all__ = ["DrillSealCallback"]
