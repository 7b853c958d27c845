"""Lightning's ``DeepSpeedStrategy`` checkpoints: a DeepSpeed checkpoint inside Lightning's.

With the DeepSpeed strategy, ``ModelCheckpoint`` writes each save as a *directory* named like
Lightning's file (``epoch=1-step=8.ckpt/``) and lets DeepSpeed fill it: ``latest`` (naming the
tag, always ``checkpoint``), ``checkpoint/`` with ``mp_rank_00_model_states.pt`` and every
rank's ZeRO partitions, and DeepSpeed's ``zero_to_fp32.py``. Lightning's own state — its loops
(the data position and step counters), LR schedulers, ``global_step``, ``epoch``, callbacks —
travels in DeepSpeed's ``client_state``, inside the model states. So it is one checkpoint of two
writers: DeepSpeed's proof and partitions (its format, nested), and Lightning's state read from
the client state as Lightning's ``.ckpt`` keys are (:func:`lightning_view`). Lightning's resume
restarts at step 0 without its loops, and from scratch when ``last.ckpt`` names a save never
written: both are required or judged (the ``last.ckpt`` link is a pointer).
"""

from __future__ import annotations

from typing import Any

from drill import formats, parts
from drill.checkpoints import CheckpointRef, IncompleteSave, step_of
from drill.formats.base import (
    Format,
    RestoreContext,
    Structure,
    nested_structure,
    restore_nested,
    restored_nested_structure,
    tally,
)
from drill.formats.canonical import inventory
from drill.restore import RestoreResult
from drill.storage import Listing, Storage

TAG = "checkpoint"
"""The tag Lightning's strategy always gives DeepSpeed's ``save_checkpoint``."""
CLIENT = f"{parts.EXTRA}.client_state."
LOOPS_NEEDED = (
    "Lightning resumes its step, epoch and data position from its loops; without them it starts again at step 0"
)


def lightning_view(state: dict[str, Any]) -> dict[str, Any]:
    """DeepSpeed's canonical state with Lightning's client state read as Lightning's keys are:
    ``global_step``/``epoch`` the train state, the fit loop the data position, the schedulers."""
    out: dict[str, Any] = {}
    listed = CLIENT + "lr_schedulers."
    schedulers = {k[len(listed) :].split(".", 1)[0] for k in state if k.startswith(listed)}
    for key, value in state.items():
        if not key.startswith(CLIENT):
            out[key] = value
            continue
        rest = key[len(CLIENT) :]
        head, _, tail = rest.partition(".")
        if head == "global_step":
            out[f"{parts.TRAIN_STATE}.step"] = value
        elif head == "epoch":
            out[f"{parts.TRAIN_STATE}.epoch"] = value
        elif rest.startswith("loops.fit_loop."):
            out[f"{parts.DATALOADER}.{rest[len('loops.fit_loop.') :]}"] = value
        elif head == "lr_schedulers" and tail:
            sub = tail.partition(".")[2]
            out[f"{parts.LR_SCHEDULER}.{sub}" if len(schedulers) == 1 else f"{parts.LR_SCHEDULER}.{tail}"] = value
        else:
            out[f"{parts.EXTRA}.lightning.{rest}"] = value
    return out


def holds_lightning(state: dict[str, Any]) -> bool:
    """Whether a DeepSpeed checkpoint's client state is Lightning's (drilled one level down,
    ``epoch=1-step=8.ckpt/checkpoint/`` is still Lightning's checkpoint)."""
    return f"{CLIENT}pytorch-lightning_version" in state


def lightning_layout(layout: Any, name: str) -> Any:
    """What Lightning's strategy says of a DeepSpeed checkpoint's layout: its loops are required."""
    layout.format = name
    layout.required = (parts.MODEL, parts.OPTIMIZER, parts.TRAIN_STATE, parts.DATALOADER)
    layout.recommended = (parts.LR_SCHEDULER,)
    layout.never_saved = {
        parts.RNG: "Lightning does not checkpoint RNG state (seed_everything seeds a resumed run afresh)"
    }
    layout.scheduler_per_step = False  # Lightning steps schedulers per epoch unless configured per step
    layout.loader_shuffles = None
    layout.must_hold = {parts.TRAIN_STATE: ("step",), parts.DATALOADER: ("epoch_loop.batch_progress",)}
    layout.recognized = (
        "Lightning's DeepSpeed strategy: DeepSpeed's checkpoint with Lightning's loops in its client state"
    )
    layout.save_hint = LOOPS_NEEDED
    return layout


class LightningDeepSpeed(Format):
    """``epoch=E-step=S.ckpt/`` directories of Lightning's DeepSpeed strategy (see the module's docstring)."""

    name = "lightning-deepspeed"
    label = "Lightning with DeepSpeed (epoch=E-step=S.ckpt/ holding a DeepSpeed checkpoint)"
    marker = f"{TAG}/mp_rank_00_model_states.pt"

    def recognize(
        self, storage: Storage, uri: str, name: str, entries: Listing
    ) -> CheckpointRef | IncompleteSave | None:
        tag = entries.get(TAG)
        if not name.endswith(".ckpt") or tag is None or not tag.is_dir:
            return None
        inner = formats.get("deepspeed").recognize(storage, tag.uri, TAG, Listing.of(storage.list(tag.uri)))
        step = step_of(name)
        if isinstance(inner, IncompleteSave):
            return IncompleteSave(uri, name, step, f"its DeepSpeed checkpoint ({TAG}/) is unfinished: {inner.reason}")
        if inner is None:
            return IncompleteSave(uri, name, step, f"{self.marker} is missing: DeepSpeed never finished the save")
        if entries.file("latest") is None:
            return IncompleteSave(
                uri,
                name,
                step,
                "DeepSpeed writes latest after every rank's files, and it is missing: the save never finished",
            )
        return CheckpointRef(uri=uri, name=name, step=step, format=self.name, mtime=inner.mtime)

    def every_save(self, name: str) -> bool:
        return name == "latest"

    def structure(
        self, storage: Storage, uri: str, sizes: dict[str, int], allow_classes: tuple[str, ...] = ()
    ) -> Structure | None:
        return nested_structure(formats.get("deepspeed"), storage, uri, TAG, sizes, allow_classes)

    def restore(self, storage: Storage, ref: CheckpointRef, ctx: RestoreContext) -> RestoreResult:
        """DeepSpeed's restore of ``checkpoint/``, its files named within the ``.ckpt``, then
        Lightning's state read from the client state."""
        result = RestoreResult(uri=ref.uri, format=self.name, device=str(ctx.device))
        deepspeed = formats.get("deepspeed")
        sub = restore_nested(deepspeed, storage, ref, TAG, ctx, result)
        result.structure = restored_nested_structure(deepspeed, sub, storage, TAG) or ([], {})
        layout = sub.layout
        if layout is not None:
            layout.missing_files = {f"{TAG}/{n}": why for n, why in layout.missing_files.items()}
            lightning_layout(layout, self.name)
            if ref.step is not None:
                layout.step_counters["directory name"] = ref.step
        result.layout = layout
        result.state = lightning_view(sub.state)
        result.inventory = inventory(result.state, {i.key: i.rank for i in sub.inventory if i.rank is not None})
        tally(result, result.state)
        return result


__all__ = ["LightningDeepSpeed", "holds_lightning", "lightning_layout", "lightning_view"]
