"""MosaicML Composer checkpoints.

Composer's ``Trainer`` saves ``{"state": {...}, "rng": [one per rank]}``: its ``state`` holds
the ``model`` (names → tensors), ``optimizers`` (one, by its class name, keyed by parameter
name), ``schedulers`` (by class name), the ``timestamp`` (``{"Timestamp": {"epoch", "batch",
"batch_in_epoch", "sample_in_epoch", …, wall-clock timedeltas}}``: ``batch`` is the step,
``batch_in_epoch`` the data position), ``rank_zero_seed`` (which seeds the sampler per epoch),
``dataset_state`` (a stateful dataset's, ``None`` otherwise), callbacks, algorithms, the grad
scaler and metadata; every rank's ``rng`` entry holds Python's, numpy's and torch's generators
(and CUDA's on GPUs) — Composer writes all of them on every save.

Monolithic: ``ep{epoch}-ba{batch}-rank{rank}.pt`` (rank 0's), a ``torch.save`` archive.
Sharded (FSDP with ``state_dict_type="sharded"``): an ``ep{epoch}-ba{batch}/`` DCP directory
whose keys are the same paths flattened (``state.model.…``, ``rng.0.python``) — read by the
DCP format with this module's :func:`items`. Autoresume follows ``latest-rank{rank}.pt`` (a
symlink, to the directory for a sharded run), judged like every pointer (:mod:`drill.checks.resume`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from drill import parts
from drill.checkpoints import CheckpointRef
from drill.formats.canonical import Layout, flatten
from drill.formats.torch_save import TorchSave
from drill.storage import Entry

_FILE = re.compile(r"^ep\d+-ba\d+-rank\d+\.pt\Z")
TIMESTAMP = "state.timestamp.Timestamp."
_POSITION = ("epoch", "batch_in_epoch", "sample_in_epoch", "token_in_epoch")
"""Where in its data a resume continues: Composer reseeds the sampler for the epoch and skips this far."""
ALWAYS_SAVED = {
    parts.TRAIN_STATE: ("step", "epoch"),
    parts.DATALOADER: ("dataset_state", "seed"),
}
"""What Composer's ``State.state_dict`` writes on every save, beyond the parts themselves."""


MARKS = ("rank_zero_seed", "run_name", "timestamp")
"""Entries of Composer's ``state`` no other writer names so (any one, beside its ``model``)."""


def is_composer(obj: Any) -> bool:
    """Composer's shape: a ``state`` holding its ``model`` and one of :data:`MARKS` — even with
    a part cut out, so that the cut is named rather than the file read as someone else's."""
    state = obj.get("state") if isinstance(obj, Mapping) else None
    return isinstance(state, Mapping) and "model" in state and any(m in state for m in MARKS)


def is_composer_keys(keys: set[str]) -> bool:
    """The same shape in a sharded checkpoint's flattened keys."""
    heads = {k.split(".", 2)[1] for k in keys if k.startswith("state.") and k.count(".") >= 1}
    return "model" in heads and any(m in heads for m in MARKS)


def items(key: str, value: Any) -> Iterator[tuple[str, Any]]:
    """One entry of Composer's state, by its flattened path, as canonical (key, value) pairs."""
    head, _, rest = key.partition(".")
    if head == "rng":
        rank, _, gen = rest.partition(".")
        yield (f"{parts.RNG}.rank_{rank}.{gen}" if rank.isdigit() else f"{parts.RNG}.{rest}"), value
        return
    if head != "state":
        yield f"{parts.EXTRA}.{key}", value
        return
    section, _, sub = rest.partition(".")
    if section == "model":
        yield f"{parts.MODEL}.{sub}", value
    elif section in ("optimizers", "schedulers"):  # keyed by the class name: one optimizer (Composer's rule)
        part = parts.OPTIMIZER if section == "optimizers" else parts.LR_SCHEDULER
        yield (f"{part}.{sub.partition('.')[2]}" if "." in sub else part), value
    elif key.startswith(TIMESTAMP):
        field = key[len(TIMESTAMP) :]
        yield f"{parts.TRAIN_STATE}.{field}", value
        if field == "batch":
            yield f"{parts.TRAIN_STATE}.step", value
        if field in _POSITION:
            yield f"{parts.DATALOADER}.{field}", value
    elif section == "dataset_state":
        yield (f"{parts.DATALOADER}.dataset_state.{sub}" if sub else f"{parts.DATALOADER}.dataset_state"), value
    elif section == "rank_zero_seed":
        yield f"{parts.DATALOADER}.seed", value
        yield f"{parts.EXTRA}.{key}", value
    else:
        yield f"{parts.EXTRA}.{key}", value


def layout_facts(layout: Layout) -> Layout:
    """What Composer's layout says beyond its keys, on a layout either path made."""
    layout.required = (parts.MODEL, parts.OPTIMIZER, parts.TRAIN_STATE, parts.DATALOADER, parts.RNG)
    layout.recommended = (parts.LR_SCHEDULER,)
    layout.optimizer_keys = "fqn"
    layout.rng_generators = ("python", "numpy", "torch CPU")
    layout.scheduler_per_step = False  # Composer steps a torch scheduler per epoch unless told otherwise
    layout.must_hold = dict(ALWAYS_SAVED)
    layout.save_hint = "Composer's Trainer saves it on every save: was the checkpoint edited or cut short?"
    return layout


def canonicalize(obj: dict[str, Any]) -> tuple[dict[str, Any], Layout]:
    """A monolithic Composer checkpoint's canonical view: its state flattened to the paths a
    sharded one has, each RNG state one value, then :func:`items`."""
    flat: dict[str, Any] = {}
    for name, value in obj.items():
        if name == "rng" and isinstance(value, list):
            for rank, gens in enumerate(value):
                for gen, state in gens.items() if isinstance(gens, Mapping) else [("state", gens)]:
                    flat[f"rng.{rank}.{gen}"] = state
        else:
            flatten(value, name, flat)
    state = {k: v for key, value in flat.items() for k, v in items(key, value)}
    layout = Layout(
        format="composer", required=(), recognized="Composer: state.{model, optimizers, timestamp} beside rng"
    )
    return state, layout_facts(layout)


class Composer(TorchSave):
    """Composer's monolithic ``ep{e}-ba{b}-rank{r}.pt`` (see the module's docstring); its
    sharded directories are DCP's, read with :func:`items`."""

    name = "composer"
    label = "MosaicML Composer (ep{e}-ba{b}-rank{r}.pt, FSDP sharded ep{e}-ba{b}/)"

    def view_of(self, obj: Any) -> tuple[dict[str, Any], Layout] | None:
        return canonicalize(obj) if is_composer(obj) else None

    def recognize_file(self, entry: Entry) -> CheckpointRef | None:
        return super().recognize_file(entry) if _FILE.match(entry.name) else None


__all__ = ["Composer", "canonicalize", "is_composer", "is_composer_keys", "items", "layout_facts"]
