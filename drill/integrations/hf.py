"""transformers' ``Trainer``: every ``checkpoint-N`` sealed right after it is saved.

The Trainer writes its checkpoints through ``torch.save`` and safetensors, which drill cannot
wrap; so :class:`DrillSealCallback` seals each one in ``on_save``, on every rank at once: each
hashes its share of the files (balanced by bytes) and rank 0 writes ``drill-manifest.json``
(:func:`~drill.sdk.sealed.seal_across_ranks`). Then ``drill run``, ``drill verify`` and
``drill.sdk.load`` prove every byte of it, and the keyed seal authenticates it.

    from drill.integrations.hf import DrillSealCallback
    trainer = Trainer(..., callbacks=[DrillSealCallback(key=drill.sdk.load_key())])

And its replay: :func:`trainer_replay` resumes the run's own ``Trainer`` from a checkpoint and
hands drill one step at a time (a replay entrypoint in one line: see docs/replay.md).
"""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from drill.integrity.sealing import SealReport
from drill.replay.paced import PacedReplay
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


# -- replay -----------------------------------------------------------------------------------
PLAIN = (str, int, float, bool, type(None))


def saved_arguments(checkpoint: str) -> dict[str, Any]:
    """The ``TrainingArguments`` a run saved beside a checkpoint (``training_args.bin``), as
    plain values: read inert (:mod:`drill.formats.inert` — nothing in the file is imported or
    run), keeping the fields ``TrainingArguments`` takes whose values are plain (strings,
    numbers, lists of them); its objects (accelerator state, devices, enums) are left out."""
    import dataclasses

    from transformers import TrainingArguments

    from drill.formats.hf import TRAINING_ARGS
    from drill.formats.inert import load_inert
    from drill.storage.local import read_regular

    obj, _ = load_inert(memoryview(read_regular(os.path.join(checkpoint, TRAINING_ARGS), 64 << 20)))
    saved = getattr(obj, "fields", {})
    takes = {f.name for f in dataclasses.fields(TrainingArguments) if f.init}

    def plain(value: Any) -> bool:
        if isinstance(value, (list, tuple)):
            return all(isinstance(v, PLAIN) for v in value)
        return isinstance(value, PLAIN)

    return {k: v for k, v in saved.items() if k in takes and plain(v)}


class TrainerReplay(PacedReplay):
    """A replay target (see docs/replay.md) that resumes a ``transformers.Trainer`` from a
    ``checkpoint-N`` exactly as the run would — ``trainer.train(resume_from_checkpoint=...)``:
    the model's weights, the optimizer, the scheduler, every rank's RNG and the data position
    all restored by the Trainer's own code — one optimizer step per :meth:`step`."""

    def __init__(self, trainer: Any) -> None:
        super().__init__()
        self.trainer = trainer
        trainer.add_callback(_Pacer(self))

    def run(self) -> None:
        self.trainer.train(resume_from_checkpoint=self.checkpoint)


class _Pacer(TrainerCallback):
    """Hands each logged step to the replay, and waits for the next."""

    def __init__(self, replay: PacedReplay) -> None:
        self.replay = replay

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.replay.restored()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if logs and "loss" in logs:
            record = {
                "step": state.global_step,
                "loss": logs["loss"],
                "grad_norm": logs.get("grad_norm"),
                "lr": logs.get("learning_rate"),
            }
            self.replay.stepped(record)


def trainer_replay(
    checkpoint: str,
    device: Any,
    *,
    train_dataset: Any,
    model: Any = None,
    scratch: str | None = None,
    **trainer_kwargs: Any,
) -> TrainerReplay:
    """The replay target of a ``Trainer`` run, from what the run saved: its ``TrainingArguments``
    (:func:`saved_arguments`), the model built from the checkpoint's ``config.json`` (the class
    its ``architectures`` names; or ``model``) — its weights, optimizer, scheduler, RNG and data
    position are then the checkpoint's — and the run's dataset, which only the user can give.
    The replay logs every step (compared with ``trainer_state.json``'s ``log_history``) and
    writes nothing into the run: its output goes to ``scratch`` (a new temporary directory)."""
    import tempfile

    import transformers
    from transformers import AutoConfig, Trainer, TrainingArguments

    kwargs = saved_arguments(checkpoint)
    kwargs.update(
        output_dir=scratch or tempfile.mkdtemp(prefix="drill-hf-replay-"), save_strategy="no", report_to=[],
        logging_strategy="steps", logging_steps=1, disable_tqdm=True, use_cpu=getattr(device, "type", str(device)) == "cpu",
    )  # fmt: skip
    kwargs.pop("logging_dir", None)
    if model is None:
        config = AutoConfig.from_pretrained(checkpoint)
        architectures = getattr(config, "architectures", None) or []
        if not architectures or not hasattr(transformers, architectures[0]):
            raise ValueError(
                f"{checkpoint}/config.json names no model class transformers has ({architectures}): pass model="
            )
        model = getattr(transformers, architectures[0])(config)
    trainer = Trainer(model=model, args=TrainingArguments(**kwargs), train_dataset=train_dataset, **trainer_kwargs)
    return TrainerReplay(trainer)


__all__ = ["DrillSealCallback", "TrainerReplay", "saved_arguments", "trainer_replay"]
