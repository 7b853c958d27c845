"""The canonical view every format adapter produces.

A checkpoint becomes a flat mapping ``part.key.path → value`` with ``part`` one of
:data:`drill.parts.CANONICAL_PARTS` (or ``extra``), plus facts a format knows about itself:
which ranks saved per-rank state, which step counters it carries, how its optimizer keys
parameters, and what it is expected to hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from drill.restore.result import TensorInfo


@dataclass(slots=True, kw_only=True)
class Layout:
    """What a format adapter knows about the checkpoint beyond its tensors."""

    format: str
    required: tuple[str, ...]
    """Parts a resume of this framework cannot do without."""
    recommended: tuple[str, ...] = ()
    """Parts whose absence a resume survives, differently: reported as warnings."""
    optimizer_keys: str = "fqn"
    """``fqn`` (state keyed by parameter name, as DCP), ``index`` (torch.optim's own) or
    ``flat`` (ZeRO: per rank, a flat fp32 partition of each parameter group and its moments,
    as ``optimizer.partitions.rank_<r>.<group>.<slot>``)."""
    flat_groups: list[int] = field(default_factory=list)
    """For ``flat``: the elements of each parameter group, which the ranks' partitions must cover."""
    step_counters: dict[str, int] = field(default_factory=dict)
    """Source → step value, from places other than the state (file names, JSON)."""
    must_hold: dict[str, tuple[str, ...]] = field(default_factory=lambda: {"train_state": ("step",)})
    """Part → the entries its writer always saves in it, each absent one damage when the part is
    there (``train_state.step``; torchtune's recipes count epochs and rebuild the step;
    Composer's loader state is its ``dataset_state`` and seed)."""
    scheduler_per_step: bool = True
    """Whether the LR scheduler steps once per optimizer step (so its counter must agree)."""
    rank_files: dict[str, list[int]] = field(default_factory=dict)
    """Part → the ranks that saved it as separate files (HF's rng_state_{rank}.pth)."""
    multi_rank: bool = False
    """The files say more than one rank saved (HF names rng files per rank only then)."""
    recognized: str | None = None
    """Which trainer's layout this is (``torchtitan``, ``Megatron torch_dist``, …) and how drill
    knows, for the evidence."""
    never_saved: dict[str, str] = field(default_factory=dict)
    """Parts this layout never saves, and why: a warning, not a failure, unless required."""
    rng_generators: tuple[str, ...] | None = None
    """The generators this writer saves (``python``, ``numpy``, ``torch CPU``): one of them
    missing is damage; one it never saves is not asked for. None: the writer's set is not known
    (torch's is required, python's and numpy's only warned about)."""
    loader_shuffles: bool | None = True
    """Whether the data loader shuffles (then a position alone does not fix the data order)."""
    params: frozenset[str] = frozenset()
    """``model.<fqn>`` keys the optimizer updates; other model keys are buffers."""
    side_files: tuple[str, ...] = ()
    """Files beside the shards that this layout's resume needs (``common.pt``, ``meta.pt``)."""
    missing_files: dict[str, str] = field(default_factory=dict)
    """Files the format's own record of the save names that the checkpoint lacks (a side file,
    a rank's partition) → what a resume reads it for."""
    saved_ranks: list[int] = field(default_factory=list)
    """The ranks that wrote the checkpoint, where its file names say (DCP's ``__<rank>_<n>.distcp``)."""
    notes: list[str] = field(default_factory=list)
    save_hint: str = "save it with the other Stateful objects passed to dcp.save"
    """What to do about a missing required part, in this framework's terms."""


def flatten(obj: Any, prefix: str, out: dict[str, Any]) -> None:
    """Nested dicts/lists → ``prefix.key.0.sub`` keys, as DCP flattens state dicts."""
    import torch

    if isinstance(obj, Mapping):
        if not obj:
            out[prefix] = {}
        for k, v in obj.items():
            flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(obj, (list, tuple)) and any(isinstance(v, (Mapping, list, tuple, torch.Tensor)) for v in obj):
        for i, v in enumerate(obj):
            flatten(v, f"{prefix}.{i}", out)
    else:
        out[prefix] = obj


def inventory(state: Mapping[str, Any], ranks: Mapping[str, int] | None = None) -> list[TensorInfo]:
    import torch

    ranks = ranks or {}
    return [
        TensorInfo(k, tuple(v.shape), str(v.dtype).replace("torch.", ""), v.numel() * v.element_size(), ranks.get(k))
        for k, v in state.items()
        if isinstance(v, torch.Tensor)
    ]
