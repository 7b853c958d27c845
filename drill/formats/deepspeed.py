"""DeepSpeed ``save_checkpoint`` directories (ZeRO stages 0–3).

A save is ``<tag>/`` (``global_stepN/`` unless the trainer names it) beside a ``latest`` file
that DeepSpeed writes once the save is done and that ``load_checkpoint`` follows:

- ``mp_rank_00_model_states.pt`` — the module's weights (ZeRO-3 partitions them, so it holds
  zero-size tensors, one such file per data-parallel rank,
  ``zero_pp_rank_<r>_mp_rank_00_model_states.pt``), the LR
  scheduler, ``global_steps``, ``dp_world_size``, ``param_shapes`` and the trainer's
  ``client_state``;
- ``zero_pp_rank_<r>_mp_rank_00_optim_states.pt`` per data-parallel rank (``bf16_`` first with
  the bf16 optimizer) — the rank's **flat fp32 partition** of every parameter group and the
  base optimizer's moments for it, not per-parameter slots. ZeRO-3 partitions each parameter
  across the ranks; ZeRO-1/2 the concatenated group.

The optimizer files pickle DeepSpeed's own classes (``LossScaler``, ``ZeroStageEnum``,
``fragment_address``); they are read inert (:mod:`drill.formats.inert`): nothing of DeepSpeed
is imported or run. ZeRO-3's weights are rebuilt from the partitions as DeepSpeed's
``zero_to_fp32`` does (drill never runs that script, which the save leaves beside the tags).
DeepSpeed saves no RNG and no data-loader state.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from drill import parts
from drill.checkpoints import CheckpointRef, IncompleteSave, step_of
from drill.findings import Finding, Severity
from drill.formats.base import Format, RestoreContext, Structure
from drill.formats.bundle import INERT, Member
from drill.ranks import MAX_WORLD, absent, each_missing, plausible_world
from drill.restore import RestoreResult
from drill.storage import Listing, Storage

_MODEL = re.compile(r"^(?:(?:bf16_)?zero_pp_rank_(\d+)_)?mp_rank_(\d+)_model_states\.pt\Z")
_OPTIM = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt\Z")
NEVER_SAVED = {
    parts.RNG: "DeepSpeed's save_checkpoint saves no RNG state (a trainer can pass it in client_state)",
    parts.DATALOADER: "DeepSpeed saves no data-loader state without its data-efficiency sampler (a trainer can pass it in client_state)",
}
_ENGINE_KEYS = frozenset(
    {"module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params", "frozen_param_fragments", "lr_scheduler",
     "data_sampler", "random_ltd", "sparse_tensor_module_names", "skipped_steps", "global_steps", "global_samples", "dp_world_size",
     "mp_world_size", "ds_config", "ds_version", "checkpoint_parallel_dimensions", "iteration"}
)  # fmt: skip
"""What the engine itself saves in the model states; anything else is the trainer's client_state."""


def _files(names: list[str]) -> tuple[dict[int, str], dict[int, str]]:
    """(model-states files by data-parallel rank (-1: the one file of ZeRO 0–2), optimizer files by rank), model-parallel rank 0."""
    models, optims = {}, {}
    for name in names:
        if (m := _MODEL.match(name)) and int(m.group(2)) == 0:
            models[int(m.group(1)) if m.group(1) is not None else -1] = name
        elif (m := _OPTIM.match(name)) and int(m.group(2)) == 0:
            optims[int(m.group(1))] = name
    return models, optims


def _committed(storage: Storage, uri: str, name: str) -> bool:
    """Whether the run's ``latest`` names this save: DeepSpeed writes it once every rank's
    files are written, so a rank's file missing from a save it names is damage, not a save
    still running."""
    parent = uri.rstrip("/").rsplit("/", 1)[0]
    try:
        with storage.open(storage.child(parent, "latest")) as f:
            return f.read(4096).decode("utf-8", "replace").strip() == name
    except (OSError, ValueError):
        return False


def _gap(ranks: Mapping[int, str]) -> int | None:
    return next((r for r in range(max(ranks) + 1) if r not in ranks), None) if ranks else None


class DeepSpeed(Format):
    """DeepSpeed ZeRO checkpoints (see the module's docstring)."""

    name = "deepspeed"
    label = "DeepSpeed (ZeRO 0–3)"
    marker = "mp_rank_00_model_states.pt"

    def recognize(
        self, storage: Storage, uri: str, name: str, entries: Listing
    ) -> CheckpointRef | IncompleteSave | None:
        models, optims = _files([e.name for e in entries.suffixed(".pt") if e.is_file])
        if not models and not optims:
            return None
        step = step_of(name)
        if not models:
            return IncompleteSave(
                uri,
                name,
                step,
                "DeepSpeed optimizer partitions but no model states (mp_rank_00_model_states.pt): the save never finished",
            )
        for what, ranks in (
            ("optimizer partition", optims),
            ("model states", {r: n for r, n in models.items() if r >= 0}),
        ):
            missing = _gap(ranks)
            if missing is not None and not _committed(storage, uri, name):
                return IncompleteSave(
                    uri,
                    name,
                    step,
                    f"DeepSpeed {what} files of ranks up to {max(ranks)} but none of rank {missing}: the save never finished",
                )
        newest = max(e.mtime for e in entries if e.is_file)
        return CheckpointRef(uri=uri, name=name, step=step, format=self.name, mtime=newest)

    def writers(self, sizes: dict[str, int]) -> list[int]:
        return sorted(_files(list(sizes))[1])

    def structure(
        self, storage: Storage, uri: str, sizes: dict[str, int], allow_classes: tuple[str, ...] = ()
    ) -> Structure | None:
        from drill.formats import bundle
        from drill.formats.inert import load_inert
        from drill.integrity.reading import read_whole

        models, optims = _files(list(sizes))
        if not models:
            return None
        findings: list[Finding] = []
        first = models[min(models)]
        try:
            states, _ = load_inert(read_whole(storage, storage.child(uri, first), sizes[first], hash=False).view)
        except Exception:  # noqa: BLE001 - its structure below says what is wrong with it
            states = None
        proof = bundle.structure(
            storage,
            uri,
            sizes,
            [Member(n, INERT, sizes[n]) for n in (*models.values(), *optims.values())],
            {"zero_stage": _stage(models, optims)},
        )
        assert proof is not None
        findings += proof[0] + missing_partitions(states, models, optims, check="integrity")
        findings += _world(states, first)[1]  # as the run finds it
        return findings, proof[1]

    def restore(self, storage: Storage, ref: CheckpointRef, ctx: RestoreContext) -> RestoreResult:
        """Read every rank's files once; the flat partitions become ``optimizer.partitions``,
        ZeRO-3's weights are rebuilt from them."""
        from drill.formats.bundle import restore_members

        result = RestoreResult(uri=ref.uri, format=self.name, device=str(ctx.device))
        sizes = {e.name: e.size for e in storage.list(ref.uri) if e.is_file}
        models, optims = _files(list(sizes))
        result.layout = _layout(ref, _stage(models, optims))
        members = [Member(n, INERT, sizes[n]) for n in (*models.values(), *optims.values())]
        restore_members(
            storage, ref.uri, members, ctx, result, lambda loaded: _canonical(loaded, models, optims, result)
        )
        from drill.formats import lightning_deepspeed as lightning

        if lightning.holds_lightning(result.state):  # Lightning's strategy wrote it: its loops are read too
            result.state = lightning.lightning_view(result.state)
            lightning.lightning_layout(result.layout, self.name)
        return result


def _stage(models: Mapping[int, str], optims: Mapping[int, str]) -> int:
    """ZeRO-3 writes model states per rank; ZeRO 0 no optimizer partitions; 1 and 2 look alike on disk."""
    return 3 if any(r >= 0 for r in models) else (1 if optims else 0)


def _layout(ref: CheckpointRef, stage: int) -> Any:
    from drill.formats.canonical import Layout

    layout = Layout(
        format="deepspeed",
        required=(parts.MODEL, parts.OPTIMIZER, parts.TRAIN_STATE),
        recommended=(parts.LR_SCHEDULER,),
        optimizer_keys="flat" if stage else "index",
        never_saved=dict(NEVER_SAVED),
        recognized=f"DeepSpeed ZeRO-{stage if stage != 1 else '1/2'}: "
        + (
            "one model-states file and one flat fp32 optimizer partition per data-parallel rank"
            if stage
            else "model and optimizer in mp_rank_00_model_states.pt"
        ),
        save_hint="DeepSpeed's save_checkpoint writes it on every rank: was a rank's file deleted, or the save cut short?",
    )
    if ref.step is not None:
        layout.step_counters["directory name"] = ref.step
    return layout


def _zero_stage(states: Any) -> int | None:
    config = states.get("ds_config") if isinstance(states, dict) else None
    zero = config.get("zero_optimization") if isinstance(config, dict) else None
    return _int(zero.get("stage")) if isinstance(zero, dict) else None


def missing_partitions(
    states: Any, models: Mapping[int, str], optims: Mapping[int, str], *, check: str
) -> list[Finding]:
    """The files ``dp_world_size`` and the ZeRO stage (in the model states) say every rank wrote, that are not there."""
    world = _world(states, "")[0]
    partitioned = bool(optims) or (_zero_stage(states) or 0) >= 1
    if not world or not partitioned and not any(r >= 0 for r in models):
        return []
    out = []
    if partitioned:
        sample = next(iter(optims.values()), "zero_pp_rank_0_mp_rank_00_optim_states.pt")
        what = "its flat fp32 partition of every parameter and the optimizer moments for it"
        out += each_missing(
            absent(optims, world), lambda rank: _missing(check, _ranked(sample, rank), rank, world, what)
        )
    if any(r >= 0 for r in models):
        sample = models[min(r for r in models if r >= 0)]
        out += each_missing(
            absent(models, world), lambda rank: _missing(check, _ranked(sample, rank), rank, world, "its model states")
        )
    return out


def _ranked(name: str, rank: int) -> str:
    """``name`` (a rank's file) as rank ``rank`` names it."""
    return re.sub(r"zero_pp_rank_\d+_", f"zero_pp_rank_{rank}_", name)


def _missing(check: str, name: str, rank: int, world: int, what: str) -> Finding:
    return Finding(
        check=check,
        code="file-missing",
        severity=Severity.ERROR,
        subject=name,
        rank=rank,
        message=f"{name} is missing: the save was made by {world} data-parallel ranks and rank {rank}'s file holds {what}; DeepSpeed cannot load the checkpoint without it",
        expected="present",
        actual="missing",
    )


def _world(states: Any, name: str) -> tuple[int | None, list[Finding]]:
    """The data-parallel world size the model states ``name`` claim (None when unknown), and
    ``metadata-implausible`` when the claim is more ranks than any run has had."""
    claimed = _int(states.get("dp_world_size")) if isinstance(states, dict) else None
    world = plausible_world(claimed)
    if claimed is None or world is not None:
        return world, []
    return None, [
        Finding(
            check="integrity",
            code="metadata-implausible",
            severity=Severity.ERROR,
            subject=name,
            message=f"{name} claims dp_world_size {claimed}, more ranks than any run has had (at most {MAX_WORLD:,}): damaged or forged",
            expected=f"1..{MAX_WORLD}",
            actual=str(claimed),
        )
    ]


def _int(value: Any) -> int | None:
    """A count as an int (a 0-d tensor, a whole float); None for anything else."""
    if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# -- the canonical view -----------------------------------------------------------------------
def _canonical(
    loaded: dict[str, Any], models: Mapping[int, str], optims: Mapping[int, str], result: RestoreResult
) -> dict[str, Any]:
    from drill.formats.canonical import flatten

    layout = result.layout
    state: dict[str, Any] = {}
    first = loaded.get(models[min(models)]) if models else None
    if not isinstance(first, dict):
        result.metadata_error = (
            result.metadata_error
            or f"{models.get(min(models), 'mp_rank_00_model_states.pt') if models else 'mp_rank_00_model_states.pt'} could not be loaded: nothing is known of the save"
        )
        result.index_file = models[min(models)] if models else None
        return state
    _engine_state(first, state)
    scheduled = state.pop(f"{parts.EXTRA}.lr_scheduler_steps", None)
    if scheduled is not None:
        layout.step_counters["lr_scheduler.last_batch_iteration + 1"] = scheduled
    if (_zero_stage(first) or 0) >= 1:
        layout.optimizer_keys = "flat"  # the ZeRO stage it was saved with, whatever files are left
    world, implausible = _world(first, models[min(models)])
    result.structure[0].extend(implausible)
    layout.saved_ranks = list(range(world)) if world else sorted(optims)
    layout.missing_files = {
        f.subject: f.message.split(": ", 1)[1]
        for f in missing_partitions(first, models, optims, check="files")
        if f.subject
    }
    if first.get("optimizer") is not None:  # ZeRO 0: a torch optimizer's state dict, keyed by index
        flatten(first["optimizer"], parts.OPTIMIZER, state)
    partitions = {r: _partition(loaded.get(n)) for r, n in optims.items() if isinstance(loaded.get(n), dict)}
    for rank, groups in sorted(partitions.items()):
        for g, slots in enumerate(groups["slots"]):
            for slot, value in slots.items():
                state[f"{parts.OPTIMIZER}.partitions.rank_{rank}.{g}.{slot}"] = value
        if rank == min(partitions):
            flatten({"param_groups": groups["param_groups"]}, parts.OPTIMIZER, state)
    shapes = _param_shapes(first)
    layout.flat_groups = [sum(math.prod(s) for s in group.values()) for group in shapes]
    steps = [
        s for groups in partitions.values() for slots in groups["slots"] if (s := _int(slots.get("step"))) is not None
    ]
    if steps:
        layout.step_counters["optimizer step"] = max(steps)
    if any(r >= 0 for r in models) and world and len(partitions) == world:
        _zero3_weights(shapes, partitions, world, state)
    layout.params = frozenset(f"{parts.MODEL}.{name}" for group in shapes for name in group)
    for key in first:
        if key not in _ENGINE_KEYS:
            flatten(first[key], f"{parts.EXTRA}.client_state.{key}", state)
    return state


def _engine_state(first: dict[str, Any], state: dict[str, Any]) -> None:
    from drill.formats.canonical import flatten
    from drill.formats.inert import plain

    module = first.get("module")
    if isinstance(module, Mapping):
        flatten(dict(module), parts.MODEL, state)
    if isinstance(first.get("lr_scheduler"), Mapping):
        flatten(plain(first["lr_scheduler"]), parts.LR_SCHEDULER, state)
    if first.get("data_sampler") is not None:
        flatten(plain(first["data_sampler"]), parts.DATALOADER, state)
    for key, canonical in (("global_steps", "step"), ("global_samples", "samples"), ("skipped_steps", "skipped_steps")):
        if key in first:
            state[f"{parts.TRAIN_STATE}.{canonical}"] = first[key]
    lbi = (
        _int((first.get("lr_scheduler") or {}).get("last_batch_iteration"))
        if isinstance(first.get("lr_scheduler"), Mapping)
        else None
    )
    if lbi is not None:
        state[f"{parts.EXTRA}.lr_scheduler_steps"] = lbi + 1
    for key in ("ds_config", "ds_version", "dp_world_size", "mp_world_size"):
        if key in first:
            flatten(plain(first[key]), f"{parts.EXTRA}.{key}", state)


def _partition(obj: Any) -> dict[str, Any]:
    """One rank's optimizer file: per parameter group, its fp32 partition and the moments for it."""
    osd = obj.get("optimizer_state_dict") if isinstance(obj, dict) else None
    osd = osd if isinstance(osd, dict) else {}
    base = osd.get("base_optimizer_state") if "base_optimizer_state" in osd else osd.get("optimizer_state_dict")
    base = base if isinstance(base, dict) else {}
    flat = osd.get("single_partition_of_fp32_groups", osd.get("fp32_flat_groups")) or []
    moments: dict[Any, Any] = base["state"] if isinstance(base.get("state"), dict) else {}
    groups = []
    for g in range(max(len(flat), len(moments))):
        slots = {k: v for k, v in (moments.get(g) or {}).items()} if isinstance(moments.get(g), dict) else {}
        if g < len(flat) and flat[g] is not None:
            slots["fp32"] = flat[g]
        groups.append(slots)
    return {"slots": groups, "param_groups": base.get("param_groups") or []}


def _param_shapes(first: dict[str, Any]) -> list[dict[str, tuple[int, ...]]]:
    shapes = first.get("param_shapes")
    groups = shapes if isinstance(shapes, list) else [shapes] if isinstance(shapes, Mapping) else []
    return [{str(k): tuple(int(d) for d in v) for k, v in g.items()} for g in groups if isinstance(g, Mapping)]


def _zero3_weights(
    shapes: list[dict[str, tuple[int, ...]]], partitions: dict[int, dict[str, Any]], world: int, state: dict[str, Any]
) -> None:
    """ZeRO-3 splits each parameter over the ranks (padded to a multiple of the world size):
    the weights are the ranks' slices side by side, as ``zero_to_fp32`` rebuilds them."""
    import torch

    flats = []
    for rank in range(world):
        pieces = [
            slots["fp32"].reshape(-1)
            for slots in partitions[rank]["slots"]
            if isinstance(slots.get("fp32"), torch.Tensor)
        ]
        flats.append(torch.cat(pieces) if pieces else torch.empty(0))
    offset = 0
    for group in shapes:
        for name, shape in group.items():
            numel = math.prod(shape)
            part = math.ceil(numel / world)
            if any(f.numel() < offset + part for f in flats):
                return  # the partitions are shorter than the shapes: the contract check says so
            state[f"{parts.MODEL}.{name}"] = torch.cat([f[offset : offset + part] for f in flats])[:numel].reshape(
                shape
            )
            offset += part


__all__ = ["DeepSpeed", "NEVER_SAVED", "missing_partitions"]
