"""Knowing state by what it is, not by who wrote it.

A trainer drill was never taught nests its state under names of its own: ``{"state":
{"model", "optimizers": {"AdamW": …}, "timestamp": …}, "rng": [per rank]}``, ``{"trainer":
{"net": …, "opt": …}}``. This module reads any such object into the canonical parts by the
shapes of its values, wherever they are nested:

- an **optimizer** is a mapping with ``state`` (a mapping) and ``param_groups`` (a list of
  mappings with ``params``) — ``torch.optim``'s ``state_dict()``, any name, any depth;
- an **LR scheduler** is a mapping with ``last_epoch`` and ``_step_count`` or ``base_lrs``;
- a **model** is a mapping of dotted names to tensors (a ``state_dict()``); of several, the one
  whose names the optimizer's state names, else the largest;
- an **RNG state** is torch's CPU generator (a ``uint8`` tensor of 5056 bytes), CUDA's (a
  list of 16-byte ones), numpy's (``('MT19937', keys, pos, …)`` or its dict form) or Python's
  (``random.getstate()``: ``(3, 625 ints, gauss)``); a list of containers of them is per rank;
- a **data loader** is what a key naming a loader, sampler or dataset state holds;
- **step counters** are integers under a key naming a step (``global_step``, ``step``,
  ``iter_num``, …, ``batch``) and ``epoch``.

Everything else is kept as ``extra``. The walk is bounded (depth and nodes) before it starts
on bytes a checkpoint controls. :func:`view` gives the canonical state and a
:class:`~drill.formats.canonical.Layout` whose ``recognized`` says where each part was found.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from drill import parts
from drill.formats.canonical import Layout, flatten

MAX_DEPTH = 24
MAX_NODES = 1_000_000
"""The walk's bound: a state nested deeper, or holding more containers, is refused."""

STEP_KEYS = (
    "global_step", "step", "iter_num", "iteration_num", "num_steps", "total_steps", "steps", "optimizer_step",
    "train_step", "global_steps", "iteration", "iter", "batch",
)  # fmt: skip
"""Names of a step counter, the most telling first (``batch`` is Composer's count of batches trained)."""
EPOCH_KEYS = ("epoch", "epochs", "epochs_run", "current_epoch")
_LOADER = re.compile(r"(?:data_?loader|sampler|dataset(?:_state)?|data_state|loader)s?\Z", re.I)
TORCH_CPU_STATE_BYTES = 5056
"""``torch.get_rng_state()``'s size: the CPU generator's Mersenne Twister state and seed."""
CUDA_STATE_BYTES = 16
"""``torch.cuda.get_rng_state()``'s size: the Philox seed and offset."""


class Unbounded(ValueError):
    """The object is nested deeper, or holds more containers, than a checkpoint's state would."""


@dataclass(slots=True)
class Found:
    """Where each kind of value was found: (path, value), in the order of the walk."""

    optimizers: list[tuple[str, Mapping[str, Any]]] = field(default_factory=list)
    schedulers: list[tuple[str, Mapping[str, Any]]] = field(default_factory=list)
    models: list[tuple[str, Mapping[str, Any]]] = field(default_factory=list)
    loaders: list[tuple[str, Any]] = field(default_factory=list)
    generators: list[tuple[str, str, Any]] = field(default_factory=list)
    """(container path, generator name, state)."""
    counters: list[tuple[str, str, int]] = field(default_factory=list)
    """(container path, key, value)."""
    rest: list[tuple[str, Any]] = field(default_factory=list)


def is_optimizer(obj: Any) -> bool:
    if not isinstance(obj, Mapping) or not isinstance(obj.get("state"), Mapping):
        return False
    groups = obj.get("param_groups")
    return isinstance(groups, (list, tuple)) and all(isinstance(g, Mapping) and "params" in g for g in groups)


def is_scheduler(obj: Any) -> bool:
    return isinstance(obj, Mapping) and "last_epoch" in obj and ("_step_count" in obj or "base_lrs" in obj)


def is_state_dict(obj: Any) -> bool:
    import torch

    return (
        isinstance(obj, Mapping)
        and bool(obj)
        and all(isinstance(k, str) for k in obj)
        and all(isinstance(v, torch.Tensor) for v in obj.values())
        and not all(generator_of(v) for v in obj.values())
    )


def generator_of(value: Any) -> str | None:
    """Which generator's state ``value`` is (``torch``, ``cuda``, ``numpy``, ``python``), by its shape."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.dtype == torch.uint8 and value.dim() == 1 and value.numel() == TORCH_CPU_STATE_BYTES:
            return "torch"
        return None
    if isinstance(value, (list, tuple)) and value:
        if all(isinstance(v, torch.Tensor) and v.dtype == torch.uint8 and v.numel() == CUDA_STATE_BYTES for v in value):
            return "cuda"
        if value[0] == "MT19937" and len(value) >= 3:
            return "numpy"
        if len(value) == 3 and value[0] == 3 and isinstance(value[1], tuple) and len(value[1]) == 625:
            return "python"
    if isinstance(value, Mapping) and value.get("bit_generator") == "MT19937" and "state" in value:
        return "numpy"
    return None


def walk(obj: Any) -> Found:
    """Every value of ``obj`` sorted by what it is; raises :class:`Unbounded` past the bounds."""
    found = Found()
    budget = [MAX_NODES]
    _walk(obj, "", 0, found, budget)
    return found


def _walk(obj: Any, path: str, depth: int, found: Found, budget: list[int]) -> None:
    if depth > MAX_DEPTH:
        raise Unbounded(f"the state is nested more than {MAX_DEPTH} levels deep at {path}")
    budget[0] -= 1
    if budget[0] < 0:
        raise Unbounded(f"the state holds more than {MAX_NODES:,} containers")
    if isinstance(obj, Mapping):
        if is_optimizer(obj):
            found.optimizers.append((path, obj))
        elif is_scheduler(obj):
            found.schedulers.append((path, obj))
        elif is_state_dict(obj):
            found.models.append((path, obj))
        elif not obj:
            found.rest.append((path, obj))
        else:
            _walk_items(obj, path, depth, found, budget)
        return
    if isinstance(obj, (list, tuple)) and generator_of(obj) is None and _holds_containers(obj):
        for i, value in enumerate(obj):
            _walk(value, _join(path, str(i)), depth + 1, found, budget)
        return
    found.rest.append((path, obj))


def _walk_items(obj: Mapping[Any, Any], path: str, depth: int, found: Found, budget: list[int]) -> None:
    for key, value in obj.items():
        name = str(key)
        here = _join(path, name)
        gen = generator_of(value)
        if gen is not None:
            found.generators.append((path, gen, value))
        elif _LOADER.search(name) and value is not None and not is_optimizer(value):
            found.loaders.append((here, value))
        elif isinstance(value, int) and not isinstance(value, bool) and name.lower() in (*STEP_KEYS, *EPOCH_KEYS):
            found.counters.append((path, name.lower(), value))
        else:
            _walk(value, here, depth + 1, found, budget)


def _holds_containers(obj: list[Any] | tuple[Any, ...]) -> bool:
    import torch

    return any(isinstance(v, (Mapping, list, tuple, torch.Tensor)) for v in obj)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


# -- the canonical view -------------------------------------------------------------------------
def view(obj: Any, *, format: str, named_step: int | None = None) -> tuple[dict[str, Any], Layout]:
    """``obj``'s canonical state and its layout, every part found by its shape (see the module's
    docstring); ``named_step``: the step the checkpoint's name carries, if any."""
    found = walk(obj)
    state: dict[str, Any] = {}
    where: list[str] = []
    optimizer = _place_optimizer(found, state, where)
    model = _place_model(found, optimizer, state, where)
    _place_first(found.schedulers, parts.LR_SCHEDULER, state, where)
    _place_loaders(found.loaders, state, where)
    _place_generators(found.generators, state, where)
    _place_counters(found.counters, state, where)
    for path, value in found.rest:
        flatten(value, _join(parts.EXTRA, path or "object"), state)
    has_step = f"{parts.TRAIN_STATE}.step" in state or named_step is not None
    layout = Layout(
        format=format,
        required=(parts.MODEL, parts.OPTIMIZER) + (() if has_step else (parts.TRAIN_STATE,)),
        recommended=(parts.LR_SCHEDULER, parts.DATALOADER, parts.RNG) + ((parts.TRAIN_STATE,) if has_step else ()),
        optimizer_keys="fqn" if optimizer is not None and _keyed_by_name(optimizer) else "index",
        scheduler_per_step=False,  # how often an unknown writer steps its scheduler is not known
        recognized="unknown writer, state found by its shape: " + ("; ".join(where) or "nothing a resume needs"),
        save_hint="no model/optimizer state was found anywhere in the checkpoint's objects",
        params=frozenset(f"{parts.MODEL}.{k}" for k in (model or {})) if optimizer is not None else frozenset(),
    )
    if named_step is not None:
        layout.step_counters["name"] = named_step
    return state, layout


def _keyed_by_name(optimizer: Mapping[str, Any]) -> bool:
    keys = list(optimizer["state"])
    return bool(keys) and not all(isinstance(k, int) or (isinstance(k, str) and k.isdigit()) for k in keys)


def _place_optimizer(found: Found, state: dict[str, Any], where: list[str]) -> Mapping[str, Any] | None:
    if not found.optimizers:
        return None
    # Of several (a GAN's two), the one holding the most state is checked; the others are kept.
    ranked = sorted(found.optimizers, key=lambda po: -len(po[1]["state"]))
    path, optimizer = ranked[0]
    flatten(optimizer, parts.OPTIMIZER, state)
    where.append(f"optimizer at {path or '(top)'}")
    for other, value in ranked[1:]:
        flatten(value, _join(parts.EXTRA, other), state)
        where.append(f"another optimizer at {other} (kept, not checked)")
    return optimizer


def _place_model(
    found: Found, optimizer: Mapping[str, Any] | None, state: dict[str, Any], where: list[str]
) -> Mapping[str, Any] | None:
    if not found.models:
        return None
    names = {str(k) for k in optimizer["state"]} if optimizer is not None and _keyed_by_name(optimizer) else set()
    ranked = sorted(found.models, key=lambda pm: (-len(names & set(pm[1])), -len(pm[1])))
    path, model = ranked[0]
    flatten(model, parts.MODEL, state)
    where.append(f"model at {path or '(top)'} ({len(model)} tensors)")
    for other, value in ranked[1:]:
        flatten(value, _join(parts.EXTRA, other), state)
    return model


def _place_first(found: list[tuple[str, Any]], part: str, state: dict[str, Any], where: list[str]) -> None:
    for i, (path, value) in enumerate(found):
        flatten(value, part if i == 0 else _join(parts.EXTRA, path), state)
        if i == 0:
            where.append(f"{part} at {path or '(top)'}")


def _place_loaders(found: list[tuple[str, Any]], state: dict[str, Any], where: list[str]) -> None:
    if len(found) == 1:
        _place_first(found, parts.DATALOADER, state, where)
        return
    for path, value in found:  # several (a train and an eval loader): each under its own name
        flatten(value, _join(parts.DATALOADER, path), state)
    if found:
        where.append(f"{parts.DATALOADER} at {', '.join(p for p, _ in found)}")


def _place_generators(found: list[tuple[str, str, Any]], state: dict[str, Any], where: list[str]) -> None:
    containers = list(dict.fromkeys(path for path, _, _ in found))
    ranked = len(containers) > 1 and all(_rank_of(c) is not None for c in containers)
    for path, gen, value in found:
        if len(containers) == 1:
            key = f"{parts.RNG}.{gen}"
        elif ranked:
            key = f"{parts.RNG}.rank_{_rank_of(path)}.{gen}"
        else:
            key = f"{parts.RNG}.{path.replace('.', '_')}.{gen}" if path != containers[0] else f"{parts.RNG}.{gen}"
        state.setdefault(key, value)
    if containers:
        label = f"{len(containers)} ranks' generators at {containers[0].rsplit('.', 1)[0]}" if ranked else containers[0]
        where.append(f"rng at {label or '(top)'}")


def _rank_of(path: str) -> int | None:
    last = path.rsplit(".", 1)[-1]
    return int(last) if last.isdigit() else None


def _place_counters(found: list[tuple[str, str, int]], state: dict[str, Any], where: list[str]) -> None:
    steps = sorted((STEP_KEYS.index(k), path.count("."), path, k, v) for path, k, v in found if k in STEP_KEYS)
    if steps:
        _, _, path, key, value = steps[0]
        state[f"{parts.TRAIN_STATE}.step"] = value
        where.append(f"step {value} at {_join(path, key)}")
    epochs = sorted((EPOCH_KEYS.index(k), path.count("."), v) for path, k, v in found if k in EPOCH_KEYS)
    if epochs:
        state[f"{parts.TRAIN_STATE}.epoch"] = epochs[0][2]
    for path, key, value in found:  # every counter, where it was found
        state.setdefault(f"{parts.TRAIN_STATE}.{_join(path, key)}", value)


__all__ = ["Found", "STEP_KEYS", "Unbounded", "generator_of", "is_optimizer", "is_scheduler", "view", "walk"]
