"""transformers' ``Trainer``: every ``checkpoint-N`` sealed right after it is saved.

The Trainer writes its checkpoints through ``torch.save`` and safetensors, which drill cannot
wrap; so :class:`DrillSealCallback` seals each one in ``on_save``, on every rank at once: each
hashes its share of the files (balanced by bytes) and rank 0 writes ``drill-manifest.json``
(:func:`~drill.sdk.sealed.seal_across_ranks`). Then ``drill run``, ``drill verify`` and
``drill.sdk.load`` prove every byte of it, and the keyed seal authenticates it.

    from drill.integrations.hf import DrillSealCallback
    trainer = Trainer(..., callbacks=[DrillSealCallback(key=drill.sdk.load_key())])
"""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from drill.integrity.sealing import SealReport
from drill.sdk.sealed import record_save, seal_across_ranks


class DrillSealCallback(TrainerCallback):
    """Seal each ``checkpoint-N`` in ``on_save``; :attr:`reports` keeps what each seal cost,
    and with ``db`` (or ``$DRILL_DATABASE_URL``) each is recorded as a save."""

    def __init__(self, key: bytes | None = None, db: str | None = None) -> None:
        self.key, self.db = key, db
        self.reports: list[SealReport] = []

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        checkpoint = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if os.path.isdir(checkpoint):
            report = seal_across_ranks(checkpoint, key=self.key)
            report.record = record_save(report, checkpoint, "after-save", self.db)
            self.reports.append(report)


__all__ = ["DrillSealCallback"]
