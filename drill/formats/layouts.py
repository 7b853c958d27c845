"""The DCP layouts of the trainers big runs use, turned into drill's canonical view.

Every trainer below saves through ``torch.distributed.checkpoint``, but each arranges the state
its own way. drill recognises the layout from the keys and the files beside the shards, and
maps it onto the canonical parts (``model.``, ``optimizer.``, ``lr_scheduler.``, ``dataloader.``,
``rng.``, ``train_state.``) that the checks judge:

- **model-prefixed DCP** (drill's demo, ``dcp.save({"model": …, "optimizer": …})``): already canonical.
- **torchtitan**: the model's state flattened to the top level beside ``optimizer``
  (``state.<fqn>.<slot>``), ``lr_scheduler``, ``dataloader`` (``dp_rank_N``: the loader's state,
  pickled) and ``train_state``. No RNG, by design; its loader reads the dataset in order.
- **Megatron torch_dist** (``iter_NNNNNNN/`` with ``common.pt`` and ``metadata.json``): model keys
  at the top level (layers stacked), optimizer state as ``optimizer.state.<slot>.<fqn>``, RNG as
  ``rng_state/shard_…`` objects, and the rest — iteration, optimizer param groups and step, the
  LR scheduler, the arguments — in ``common.pt``. No data-loader state: Megatron-LM rebuilds the
  data position from the iteration and ``args.consumed_train_samples``.
- **Lightning FSDP sharded** (``<name>.ckpt/`` with ``meta.pt``): ``model`` and numbered
  optimizers (``optimizer_0``…) in the shards; step, epoch, loops (the data position) and LR
  schedulers in ``meta.pt``. No RNG, by design.

Wherever the weights sit, the model is found by what the optimizer points at: the parameter
names in its state keys are the model's parameters; keys beside them are its buffers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from drill import parts
from drill.formats.canonical import flatten

SLOTS = frozenset(
    {
        "exp_avg",
        "exp_avg_sq",
        "max_exp_avg_sq",
        "step",
        "fp32_param",
        "momentum_buffer",
        "square_avg",
        "acc_delta",
        "sum",
    }
)
_NUMBERED_OPT = re.compile(r"^optimizer_(\d+)\.")
_MEGATRON_RNG = re.compile(r"^rng_state/shard_([\d.]+)_([\d.]+)\Z")
MEGATRON_RNG_NAMES = {
    "random_rng_state": "python",
    "np_rng_state": "numpy",
    "torch_rng_state": "torch",
    "cuda_rng_state": "cuda",
}
KNOWN_HEADS = frozenset(parts.CANONICAL_PARTS) | {"extra"}
_MEGATRON_DIR = re.compile(r"^iter_\d{7}\Z")
SIDE_FILES = {
    "common.pt": "Megatron keeps the iteration, the optimizer's param groups and step, and the LR scheduler there",
    "metadata.json": "Megatron's dist_checkpointing writes it last and will not load a checkpoint without it",
    "meta.pt": "Lightning keeps step, epoch, loops (the data position) and LR schedulers there: it cannot resume without it",
}
"""Files beside the shards that a layout's resume reads, and why each matters."""


@dataclass(slots=True)
class Recognized:
    name: str
    """``model-prefixed DCP``, ``torchtitan``, ``Megatron torch_dist``, ``Lightning FSDP sharded``."""
    how: str
    """Why drill thinks so: the evidence names it."""
    never_saved: dict[str, str] = field(default_factory=dict)
    """Part → why this layout never saves it (a warning, not a failure, unless a policy requires it)."""
    loader_shuffles: bool | None = True
    """Whether the layout's data loader shuffles (so a position alone is not enough); None: cannot tell."""
    side_files: tuple[str, ...] = ()
    """Files beside the shards that hold resume state (see :data:`SIDE_FILES`): read and checked like the shards."""
    scheduler_per_step: bool = True
    required: tuple[str, ...] | None = None
    """The parts a resume of this layout cannot do without (None: every canonical part)."""
    items: Callable[[str, Any], Iterator[tuple[str, Any]]] = field(default=lambda key, value: iter([(key, value)]))
    """How one raw entry becomes canonical (key, value) pairs in this layout."""
    facts: Callable[[Any], Any] | None = None
    """What the writer's format module says of its layout beyond these fields (applied last)."""


def recognize(keys: set[str], names: set[str], dirname: str) -> Recognized:
    """The layout of a DCP checkpoint from its keys (empty when ``.metadata`` is unreadable), the
    names of its files and its directory's name."""
    from drill.formats import composer

    if composer.is_composer_keys(keys):
        return Recognized(
            "Composer FSDP sharded",
            "Composer's state.{model, optimizers, timestamp} and per-rank rng, flattened by dcp.save",
            items=composer.items,
            facts=composer.layout_facts,
        )
    if _megatron_like(keys, names, dirname):
        return Recognized(
            "Megatron torch_dist",
            "common.pt and metadata.json beside the shards; optimizer state keyed optimizer.state.<slot>.<param>",
            never_saved={
                parts.DATALOADER: "Megatron-LM rebuilds the data position from the iteration and args.consumed_train_samples"
            },
            side_files=("common.pt", "metadata.json"),
            scheduler_per_step=False,
            items=_megatron,
        )
    if "meta.pt" in names or dirname.endswith(".ckpt") or any(_NUMBERED_OPT.match(k) for k in keys):
        return Recognized(
            "Lightning FSDP sharded",
            "a .ckpt directory of DCP shards with meta.pt; optimizers numbered optimizer_0…",
            never_saved={
                parts.RNG: "Lightning does not checkpoint RNG state (seed_everything seeds a resumed run afresh)"
            },
            loader_shuffles=None,
            side_files=("meta.pt",),
            scheduler_per_step=False,  # Lightning steps schedulers once per epoch unless configured per step
            items=_lightning,
        )
    top = {k for k in keys if k.split(".", 1)[0] not in KNOWN_HEADS}
    if top and any(f in top for f in optimizer_params(keys)):
        return Recognized(
            "torchtitan",
            "model weights at the top level, named by the optimizer's state (optimizer.state.<param>.<slot>)",
            never_saved={parts.RNG: "torchtitan does not checkpoint RNG state"},
            loader_shuffles=False,
            items=_torchtitan,
        )
    nested = _nested_prefixes(keys)
    if nested is not None:
        model, optimizer = nested
        return Recognized(
            "nested DCP state",
            f"the optimizer's state under {optimizer}. names the parameters of the model under {model}. (a Stateful such as the DCP tutorial's AppState)",
            required=(parts.MODEL, parts.OPTIMIZER),  # the rest is what the trainer chose to wrap: warned about
            items=lambda key, value: _nested(key, value, model, optimizer),
        )
    return Recognized("model-prefixed DCP", "parts saved under their names (model., optimizer., …)")


_OPT_STATE = re.compile(r"^(.+?)\.state\.(.+)\.([^.]+)\Z")


def _nested_prefixes(keys: set[str]) -> tuple[str, str] | None:
    """(model prefix, optimizer prefix) when the state sits under keys of the trainer's own
    choosing (``app.model.*``, ``app.optim.state.<fqn>.<slot>``): found by what the optimizer
    names, as for torchtitan. None when the parts already sit under their canonical names."""
    named: dict[str, set[str]] = {}
    for key in keys:
        m = _OPT_STATE.match(key)
        if m and m.group(3) in SLOTS:
            named.setdefault(m.group(1), set()).add(m.group(2))
    for optimizer, fqns in sorted(named.items(), key=lambda kv: -len(kv[1])):
        fqn = next(iter(sorted(fqns)))
        for key in sorted(keys):
            if key.endswith("." + fqn) and not key.startswith(optimizer + "."):
                model = key[: -len(fqn) - 1]
                if all(f"{model}.{f}" in keys for f in fqns) and (model, optimizer) != (parts.MODEL, parts.OPTIMIZER):
                    return model, optimizer
    return None


_SIBLINGS = {
    "lr_scheduler": parts.LR_SCHEDULER, "scheduler": parts.LR_SCHEDULER, "sched": parts.LR_SCHEDULER,
    "dataloader": parts.DATALOADER, "data_loader": parts.DATALOADER, "loader": parts.DATALOADER,
    "rng": parts.RNG, "rng_state": parts.RNG, "train_state": parts.TRAIN_STATE, "progress": parts.TRAIN_STATE,
    "step": f"{parts.TRAIN_STATE}.step", "epoch": f"{parts.TRAIN_STATE}.epoch",
}  # fmt: skip


def _nested(key: str, value: Any, model: str, optimizer: str) -> Iterator[tuple[str, Any]]:
    if key.startswith(model + "."):
        yield f"{parts.MODEL}.{key[len(model) + 1 :]}", value
    elif key.startswith(optimizer + "."):
        yield f"{parts.OPTIMIZER}.{key[len(optimizer) + 1 :]}", value
    else:
        parent = model.rsplit(".", 1)[0] + "." if "." in model else ""
        rest = key[len(parent) :] if parent and key.startswith(parent) else key
        head, _, tail = rest.partition(".")
        part = _SIBLINGS.get(head)
        if part is not None:
            yield (f"{part}.{tail}" if tail else part), value
        else:
            yield (key if key.split(".", 1)[0] in KNOWN_HEADS else f"{parts.EXTRA}.{key}"), value


def _megatron_like(keys: set[str], names: set[str], dirname: str) -> bool:
    if "common.pt" in names or any(k.startswith(("optimizer.state.exp_avg.", "rng_state/shard_")) for k in keys):
        return True
    return _MEGATRON_DIR.match(dirname) is not None and "metadata.json" in names


def optimizer_params(keys: set[str] | dict[str, Any]) -> set[str]:
    """Parameter names the optimizer state refers to (``optimizer.state.<fqn>.<slot>`` or
    ``optimizer.state.<slot>.<fqn>``), whatever prefix the model keys carry."""
    out = set()
    for k in keys:
        if not k.startswith("optimizer.state."):
            continue
        rest = k[len("optimizer.state.") :]
        head, _, tail = rest.partition(".")
        if head in SLOTS and tail:
            out.add(tail)
        elif "." in rest and rest.rsplit(".", 1)[1] in SLOTS:
            out.add(rest.rsplit(".", 1)[0])
    return out


# -- raw keys → canonical keys ---------------------------------------------------------------
def canonical_items(key: str, value: Any, rec: Recognized) -> Iterator[tuple[str, Any]]:
    """The canonical (key, value) pairs one raw entry becomes."""
    yield from rec.items(key, value)


def _megatron(key: str, value: Any) -> Iterator[tuple[str, Any]]:
    if key.startswith("optimizer.state."):
        slot, _, fqn = key[len("optimizer.state.") :].partition(".")
        yield (f"optimizer.state.{fqn}.{slot}" if slot in SLOTS and fqn else key), value
        return
    m = _MEGATRON_RNG.match(key)
    if m:
        rank = m.group(1).split(".")[-1]
        states = _dicts(value)
        for i, st in enumerate(states):
            for name, gen in st.items():
                if gen is None or name not in MEGATRON_RNG_NAMES:
                    continue
                out: dict[str, Any] = {}
                flatten(gen, f"rng.rank_{rank}{'' if len(states) == 1 else f'_pp{i}'}.{MEGATRON_RNG_NAMES[name]}", out)
                yield from out.items()
        return
    yield (key if key.split(".", 1)[0] in KNOWN_HEADS else f"{parts.MODEL}.{key}"), value


def _dicts(value: Any) -> list[dict[str, Any]]:
    """The per-pipeline-stage RNG dicts of one ShardedObject, however deep the lists wrap them."""
    if isinstance(value, dict):
        return [value]
    if isinstance(value, (list, tuple)):
        return [d for v in value for d in _dicts(v)]
    return []


def _lightning(key: str, value: Any) -> Iterator[tuple[str, Any]]:
    m = _NUMBERED_OPT.match(key)
    if m:
        rest = key[m.end() :]
        if rest == "param_groups" and isinstance(value, list):
            out: dict[str, Any] = {}
            flatten({"param_groups": value}, parts.OPTIMIZER, out)
            yield from out.items()
            return
        yield f"{parts.OPTIMIZER}.{rest}", value
        return
    yield (key if key.split(".", 1)[0] in KNOWN_HEADS else f"{parts.MODEL}.{key}"), value


def _torchtitan(key: str, value: Any) -> Iterator[tuple[str, Any]]:
    head = key.split(".", 1)[0]
    if head == parts.DATALOADER and isinstance(value, (bytes, bytearray)):
        loader = _plain_pickle(bytes(value))
        if isinstance(loader, dict):
            out: dict[str, Any] = {}
            flatten(loader, key, out)
            yield from out.items()
            return
    yield (key if head in KNOWN_HEADS else f"{parts.MODEL}.{key}"), value


def _plain_pickle(data: bytes) -> Any:
    """A pickle of plain containers and numbers only (torchtitan pickles its loader's state
    dict into the checkpoint); None if it names any class at all."""
    from drill.safe_pickle import bounded, restricted_loads

    try:
        return bounded(restricted_loads(data, frozenset()), len(data))
    except Exception:  # noqa: BLE001 - an opaque loader state stays opaque
        return None


# -- side files → canonical keys -----------------------------------------------------------
def side_items(name: str, obj: Any, rec: Recognized) -> Iterator[tuple[str, Any]]:
    """The canonical entries of ``common.pt`` (Megatron) or ``meta.pt`` (Lightning)."""
    from drill.formats.inert import plain

    out: dict[str, Any] = {}
    if name == "common.pt" and isinstance(obj, dict):
        if "iteration" in obj:
            out[f"{parts.TRAIN_STATE}.step"] = obj["iteration"]
        if isinstance(obj.get("opt_param_scheduler"), dict):
            flatten(obj["opt_param_scheduler"], parts.LR_SCHEDULER, out)
        if isinstance(obj.get("optimizer"), dict):
            flatten(plain(obj["optimizer"]), parts.OPTIMIZER, out)
        for k in ("args", "checkpoint_version", "num_floating_point_operations_so_far", "rerun_state_machine"):
            if k in obj:
                out[f"extra.{k}"] = plain(obj[k])
    elif name == "meta.pt" and isinstance(obj, dict):
        if "global_step" in obj:
            out[f"{parts.TRAIN_STATE}.step"] = obj["global_step"]
        if "epoch" in obj:
            out[f"{parts.TRAIN_STATE}.epoch"] = obj["epoch"]
        schedulers = obj.get("lr_schedulers") or []
        for i, sched in enumerate(schedulers):
            flatten(plain(sched), parts.LR_SCHEDULER if i == 0 else f"{parts.LR_SCHEDULER}.{i}", out)
        if isinstance(obj.get("loops"), dict):
            flatten(plain(obj["loops"]), f"{parts.DATALOADER}.loops", out)
        for k in ("callbacks", "hyper_parameters", "pytorch-lightning_version"):
            if k in obj:
                out[f"extra.{k}"] = plain(obj[k])
    yield from out.items()


def lightning_steps(state: dict[str, Any]) -> dict[str, int]:
    """Lightning's loop progress as a step counter (batches that stepped the optimizer)."""
    for key in ("dataloader.loops.fit_loop.epoch_loop.state_dict._batches_that_stepped",):
        v = state.get(key)
        if isinstance(v, int):
            return {"loops batches stepped": v}
    return {}


__all__ = [
    "SIDE_FILES",
    "Recognized",
    "canonical_items",
    "lightning_steps",
    "optimizer_params",
    "recognize",
    "side_items",
]
