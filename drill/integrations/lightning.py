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

And its replay: :func:`lightning_replay` resumes the run's own LightningModule from a checkpoint
and hands drill one step at a time (see docs/replay.md).
"""

from __future__ import annotations

import os
from typing import Any

from drill.integrity.keys import load_key
from drill.integrity.sealing import SealReport
from drill.replay.paced import PacedReplay
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


# -- replay -----------------------------------------------------------------------------------
def saved_hyperparameters(checkpoint: str) -> dict[str, Any]:
    """The hyper-parameters a LightningModule saved (``save_hyperparameters()``) in a ``.ckpt``
    file, as plain values: read inert (:mod:`drill.formats.inert` — nothing in the file is
    imported or run). A sharded ``.ckpt/`` directory keeps them in its ``meta.pt``."""
    from drill.formats.inert import load_inert, plain
    from drill.storage.local import read_regular

    path = os.path.join(checkpoint, "meta.pt") if os.path.isdir(checkpoint) else checkpoint
    obj, _ = load_inert(memoryview(read_regular(path, 1 << 34)))
    saved = plain(obj.get("hyper_parameters") if isinstance(obj, dict) else None)
    return dict(saved) if isinstance(saved, dict) else {}


class LightningReplay(PacedReplay):
    """A replay target (see docs/replay.md) that resumes a Lightning run from its checkpoint
    with Lightning's own code — ``trainer.fit(module, ..., ckpt_path=checkpoint)``: weights,
    optimizers, schedulers and the loops' progress — one optimizer step per :meth:`step`."""

    def __init__(self, trainer: Any, module: Any, fit_kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.trainer, self.module, self.fit_kwargs = trainer, module, fit_kwargs

    def run(self) -> None:
        self.trainer.fit(self.module, ckpt_path=self.checkpoint, **self.fit_kwargs)


def lightning_replay(
    checkpoint: str,
    device: Any,
    *,
    module: Any,
    train_dataloaders: Any = None,
    datamodule: Any = None,
    scratch: str | None = None,
    **trainer_kwargs: Any,
) -> LightningReplay:
    """The replay target of a Lightning run: ``module`` — the run's LightningModule class, built
    from the hyper-parameters the checkpoint saved (:func:`saved_hyperparameters`), or an
    instance — and its data (``train_dataloaders`` or ``datamodule``), which only the user can
    give. The replay logs nothing into the run (no logger, no checkpoints; its root is
    ``scratch``, a new temporary directory) and steps until drill has what it compares with
    the run's ``metrics.csv``."""
    import tempfile

    import lightning as L

    if isinstance(module, type):
        module = module(**saved_hyperparameters(checkpoint))
    kind = getattr(device, "type", str(device))
    defaults = {
        "accelerator": "gpu" if kind == "cuda" else "cpu", "devices": 1, "logger": False, "enable_checkpointing": False,
        "enable_progress_bar": False, "enable_model_summary": False, "max_epochs": -1,
        "default_root_dir": scratch or tempfile.mkdtemp(prefix="drill-lightning-replay-"),
    }  # fmt: skip
    if "plugins" not in trainer_kwargs:
        from lightning.pytorch.plugins.environments import LightningEnvironment

        # The replay is one process, not the batch job it may run in: no SLURM environment
        # (whose SIGUSR1 handler would requeue the drill's own job), whatever $SLURM_* says.
        trainer_kwargs["plugins"] = [LightningEnvironment()]
    trainer_kwargs["callbacks"] = [*trainer_kwargs.get("callbacks", []), _Pacer()]
    trainer = L.Trainer(**{**defaults, **trainer_kwargs})
    fit = {k: v for k, v in (("train_dataloaders", train_dataloaders), ("datamodule", datamodule)) if v is not None}
    replay = LightningReplay(trainer, module, fit)
    trainer_kwargs["callbacks"][-1].replay = replay
    return replay


def _pacer_base() -> type:
    from lightning.pytorch.callbacks import Callback

    return Callback


class _Pacer(_pacer_base()):  # type: ignore[misc]
    """Hands each optimizer step to the replay, and waits for the next."""

    replay: LightningReplay

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.replay.restored()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        self.replay.stepped({"step": trainer.global_step, "loss": float(loss) if loss is not None else None})


__all__ = ["LightningReplay", "SealAfterSave", "lightning_replay", "saved_hyperparameters"]
