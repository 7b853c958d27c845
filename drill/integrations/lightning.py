"""Lightning: every sharded checkpoint (a ``*.ckpt/`` directory of DCP shards and ``meta.pt``)
sealed right after the strategy saved it.

Lightning's FSDP strategy writes its shards through DCP itself, past any ``CheckpointIO``
plugin; so :class:`SealAfterSave` goes on the strategy: once ``save_checkpoint`` returns,
every rank hashes its share of the directory's files and rank 0 writes
``drill-manifest.json`` (:func:`~drill.sdk.sealed.seal_across_ranks`: a second read,
split over the ranks). A single-file ``.ckpt`` is one ``torch.save`` zip whose entries carry
CRC-32s: drill proves it structurally, and seals directories only.

    from drill.integrations.lightning import SealAfterSave
    class Strategy(SealAfterSave, FSDPStrategy): ...
    trainer = L.Trainer(strategy=Strategy(state_dict_type="sharded"), ...)
"""

from __future__ import annotations

import os
from typing import Any

from drill.integrity.keys import load_key
from drill.integrity.sealing import SealReport
from drill.sdk.sealed import record_save, seal_across_ranks


class SealAfterSave:
    """Mix into a Lightning strategy (before it in the bases). The seal key is
    ``$DRILL_SEAL_KEY_FILE``/``$DRILL_SEAL_KEY`` when set; each save is recorded when
    ``$DRILL_DATABASE_URL`` names a database."""

    seal_reports: list[SealReport]

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)  # type: ignore[misc]
        path = os.fspath(filepath)
        if os.path.isdir(path):
            report = seal_across_ranks(path, key=load_key())
            report.record = record_save(report, path, "after-save", None)
            if not hasattr(self, "seal_reports"):
                self.seal_reports = []
            self.seal_reports.append(report)


__all__ = ["SealAfterSave"]
