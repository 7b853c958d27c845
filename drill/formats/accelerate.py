"""🤗 accelerate ``save_state`` directories.

``Accelerator.save_state(dir)`` (or, with ``automatic_checkpoint_naming``,
``<project>/checkpoints/checkpoint_<i>/``: ``i`` counts saves, it is not a step) writes, in this
order: the model (``model.safetensors`` or ``pytorch_model.bin``; ``model_1…`` for more
models; with FSDP's sharded state dict a DCP directory ``pytorch_model_fsdp_0/``), the
optimizer (``optimizer.bin``; FSDP: ``optimizer_0/``), the scheduler (``scheduler.bin``), the
data loader (``dl_state_dict.bin`` with a stateful loader, ``sampler.bin`` with a seedable
sampler), the grad scaler, then every process's RNG state ``random_states_<rank>.pkl`` — the
last file of the save proper — and then the objects registered for checkpointing
(``custom_checkpoint_<i>.pkl``). ``load_state()`` with automatic naming takes the highest
``checkpoint_<i>``, complete or not.

accelerate records no training step of its own (its ``step`` counts gradient-accumulation
boundaries): the step is what a registered object saved, or the scheduler's count.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from drill import parts
from drill.checkpoints import CheckpointRef, Discovery, IncompleteSave, step_of
from drill.findings import Finding, Severity
from drill.formats.base import Format, RestoreContext, Structure
from drill.formats.bundle import INERT, SAFETENSORS, TORCH, Member
from drill.restore import RestoreResult
from drill.storage import Entry, Listing, Storage

_RNG = re.compile(r"^random_states_(\d+)\.pkl\Z")
_CUSTOM = re.compile(r"^custom_checkpoint_(\d+)\.pkl\Z")
_NUMBERED = re.compile(
    r"^(model|pytorch_model|optimizer|scheduler|sampler|dl_state_dict)(?:_(\d+))?\.(safetensors|bin)$"
)
_SHARDED = re.compile(r"^(pytorch_model_fsdp|optimizer)_(\d+)\Z")
_SAVE_INDEX = re.compile(r"^checkpoint_(\d+)\Z")
PART_OF = {
    "model": parts.MODEL,
    "pytorch_model": parts.MODEL,
    "pytorch_model_fsdp": parts.MODEL,
    "optimizer": parts.OPTIMIZER,
    "scheduler": parts.LR_SCHEDULER,
    "sampler": parts.DATALOADER,
    "dl_state_dict": parts.DATALOADER,
}
_STEP_KEYS = ("step", "global_step", "completed_steps", "iteration", "iter_num")
NEVER_SAVED = {
    parts.DATALOADER: "accelerate saves the data loader's position only with use_stateful_dataloader=True (dl_state_dict.bin) or a seedable sampler (sampler.bin)",
    parts.TRAIN_STATE: "accelerate saves no training step of its own: register an object holding it (accelerator.register_for_checkpointing)",
}


def _parts_of(entries: Listing) -> bool:
    return any(_NUMBERED.match(e.name) for e in entries.suffixed(".safetensors", ".bin")) or any(
        _SHARDED.match(e.name) for e in entries.suffixed("")
    )


class Accelerate(Format):
    """accelerate ``save_state`` checkpoints (see the module's docstring)."""

    name = "accelerate"
    label = "accelerate save_state (plain and FSDP sharded)"
    marker = "random_states_0.pkl"

    def recognize(
        self, storage: Storage, uri: str, name: str, entries: Listing
    ) -> CheckpointRef | IncompleteSave | None:
        ranks = sorted(int(m.group(1)) for e in entries.suffixed(".pkl") if (m := _RNG.match(e.name)))
        if not ranks and not _parts_of(entries):
            return None
        step = None if _SAVE_INDEX.match(name) else step_of(name)  # checkpoint_<i> counts saves: ordered by time
        if 0 not in ranks:
            if not any(_SHARDED.match(e.name) for e in entries.dirs) and not any(
                _NUMBERED.match(e.name) for e in entries.suffixed(".bin")
            ):
                return None  # a lone model.safetensors is not accelerate's (an export, a torchtune epoch)
            return IncompleteSave(
                uri,
                name,
                step,
                "accelerate writes random_states_0.pkl after the model, optimizer, scheduler and loader, and it is missing: the save never finished",
            )
        gap = next((r for r in range(max(ranks) + 1) if r not in ranks), None)
        if gap is not None:
            return IncompleteSave(
                uri,
                name,
                step,
                f"random_states_{gap}.pkl is missing while rank {max(ranks)}'s is there: rank {gap} never finished its save",
            )
        rng = entries.get("random_states_0.pkl")
        assert rng is not None  # rank 0's RNG state is among ``ranks``
        return CheckpointRef(uri=uri, name=name, step=step, format=self.name, mtime=rng.mtime)

    def every_save(self, name: str) -> bool:
        """Each process's RNG file, every model, optimizer, scheduler, sampler and loader file,
        every registered object: ``save_state`` writes the same set each time."""
        return bool(_RNG.match(name) or _NUMBERED.match(name) or _CUSTOM.match(name))

    def pointers(
        self, storage: Storage, root: str, entries: dict[str, Entry], found: Discovery
    ) -> list[tuple[str, str]]:
        """``load_state()`` with automatic checkpoint naming: the highest ``checkpoint_<i>``, complete or not."""
        named = [(int(m.group(1)), c.name) for c in found.saves if (m := _SAVE_INDEX.match(c.name))]
        ours = any(c.format == self.name for c in found.checkpoints) or any(
            "random_states_0.pkl" in s.reason for s in found.incomplete
        )
        return [("accelerate's load_state (automatic_checkpoint_naming)", max(named)[1])] if named and ours else []

    def structure(
        self, storage: Storage, uri: str, sizes: dict[str, int], allow_classes: tuple[str, ...] = ()
    ) -> Structure | None:
        from drill.formats import bundle
        from drill.formats.base import nested_structure

        top = [m for p in sizes if "/" not in p and (m := _member(p, sizes[p])) is not None]
        proof = bundle.structure(storage, uri, sizes, top)
        findings, evidence = proof if proof is not None else ([], {})
        writers: set[int] = set()
        for subdir, fmt in _nested(storage, uri):
            sub = nested_structure(fmt, storage, uri, subdir, sizes, allow_classes)
            if sub is not None:
                findings += sub[0]
                evidence.update(sub[1])
            writers.update(
                fmt.writers({p[len(subdir) + 1 :]: n for p, n in sizes.items() if p.startswith(subdir + "/")})
            )
        findings += [_rng_missing(r, sorted(writers)) for r in sorted(writers) if f"random_states_{r}.pkl" not in sizes]
        findings += [
            Finding(
                check="integrity",
                code="file-missing",
                severity=Severity.ERROR,
                subject=n,
                message=f"{n} is missing: {why}",
            )
            for n, why in _expected({p.split("/", 1)[0] for p in sizes}).items()
        ]
        return findings, evidence

    def restore(self, storage: Storage, ref: CheckpointRef, ctx: RestoreContext) -> RestoreResult:
        from drill.formats.base import restore_nested, restored_nested_structure
        from drill.formats.bundle import restore_members

        result = RestoreResult(uri=ref.uri, format=self.name, device=str(ctx.device))
        listed = storage.list(ref.uri)
        result.layout = _layout(ref)
        members = [m for e in listed if e.is_file and (m := _member(e.name, e.size)) is not None]
        nested: dict[str, Any] = {}
        proofs: list[Structure] = []
        for subdir, fmt in _nested(storage, ref.uri, listed):
            sub = restore_nested(fmt, storage, ref, subdir, ctx, result)
            nested[subdir] = sub
            proof = restored_nested_structure(fmt, sub, storage, subdir)
            if proof is not None:
                proofs.append(proof)
        restore_members(storage, ref.uri, members, ctx, result, lambda loaded: _canonical(loaded, nested, result))
        for findings, evidence in proofs:
            result.structure[0].extend(findings)
            result.structure[1].update(evidence)
        present = {e.name for e in listed}
        result.layout.missing_files.update(_expected(present))
        if any(s.layout is not None and s.layout.saved_ranks for s in nested.values()):
            result.layout.saved_ranks = max(
                (s.layout.saved_ranks for s in nested.values() if s.layout is not None), key=len
            )
        for rank in result.layout.saved_ranks:
            if f"random_states_{rank}.pkl" not in present:
                result.layout.missing_files[f"random_states_{rank}.pkl"] = _rng_missing(
                    rank, result.layout.saved_ranks
                ).message.split(": ", 1)[1]
        result.layout.optimizer_keys = (
            "fqn"
            if any((sharded := _SHARDED.match(n)) is not None and sharded.group(1) == "optimizer" for n in nested)
            else "index"
        )
        return result


def _expected(names: set[str]) -> dict[str, str]:
    """The model and optimizer files every save of a prepared model and optimizer holds, when
    the others it writes with them are there and they are not (accelerate's load_state fails on them)."""
    out = {}
    has = {PART_OF[m.group(1)] for n in names if (m := _NUMBERED.match(n) or _SHARDED.match(n))}
    if parts.MODEL not in has and has & {parts.OPTIMIZER, parts.LR_SCHEDULER}:
        out["model.safetensors"] = (
            "accelerate saves the prepared model's weights with every save_state (model.safetensors, pytorch_model.bin or pytorch_model_fsdp_0/) and load_state reads them"
        )
    if parts.OPTIMIZER not in has and parts.LR_SCHEDULER in has:
        out["optimizer.bin"] = (
            "accelerate saves the prepared optimizer with its scheduler (optimizer.bin or optimizer_0/) and load_state reads it"
        )
    return out


def _rng_missing(rank: int, writers: list[int]) -> Finding:
    from drill.integrity.structure import NAME

    name = f"random_states_{rank}.pkl"
    return Finding(
        check=NAME, code="file-missing", severity=Severity.ERROR, subject=name, rank=rank,
        message=f"{name} is missing: ranks {', '.join(map(str, writers))} wrote the sharded state, and rank {rank}'s RNG state is in that file; "
        f"on resume rank {rank} would draw different random numbers than the original run",
    )  # fmt: skip


def _nested(storage: Storage, uri: str, listed: list[Entry] | None = None) -> list[tuple[str, Format]]:
    """The sharded sub-checkpoints (``pytorch_model_fsdp_0/``, ``optimizer_0/``): each in the format that recognizes it."""
    from drill import formats

    return formats.nested(
        storage, uri, listed if listed is not None else storage.list(uri), lambda name: _SHARDED.match(name) is not None
    )


def _member(name: str, size: int = 0) -> Member | None:
    if name.endswith(".safetensors") and _NUMBERED.match(name):
        return Member(name, SAFETENSORS, size)
    if _RNG.match(name):
        return Member(name, INERT, size)  # numpy's and python's generator states: read inert
    if name == "sampler.bin" or re.match(r"^sampler_\d+\.bin$", name) or _CUSTOM.match(name):
        return Member(name, INERT, size)  # a pickled sampler object; a registered object's state_dict
    if _NUMBERED.match(name) or name == "scaler.pt":
        return Member(name, TORCH, size)
    return None


def _layout(ref: CheckpointRef) -> Any:
    from drill.formats.canonical import Layout

    layout = Layout(
        format="accelerate",
        required=(parts.MODEL, parts.OPTIMIZER, parts.RNG),
        recommended=(parts.LR_SCHEDULER,),
        never_saved=dict(NEVER_SAVED),
        optimizer_keys="index",
        recognized="accelerate save_state: model, optimizer, scheduler, loader and one random_states_<rank>.pkl per process",
        save_hint="accelerate's save_state writes it whenever the object was passed to prepare(): was a file deleted, or the checkpoint copied without it?",
    )
    if ref.step is not None:
        layout.step_counters["directory name"] = ref.step
    return layout


def _canonical(loaded: dict[str, Any], nested: Mapping[str, RestoreResult], result: RestoreResult) -> dict[str, Any]:
    from drill.formats.canonical import flatten
    from drill.formats.inert import plain

    state: dict[str, Any] = {}
    for subdir, sub in sorted(nested.items()):
        kind, index = _SHARDED.match(subdir).groups()  # type: ignore[union-attr]
        for key, value in sub.state.items():
            head, _, rest = key.partition(".")
            state[
                _numbered(PART_OF[kind], int(index)) + "." + rest
                if head in (parts.MODEL, parts.OPTIMIZER)
                else f"{parts.EXTRA}.{subdir}.{key}"
            ] = value
    for path, obj in sorted(loaded.items()):
        if m := _RNG.match(path):
            _rng(plain(obj), int(m.group(1)), state, result)
        elif m := _CUSTOM.match(path):
            _custom(plain(obj), int(m.group(1)), state)
        elif m := _NUMBERED.match(path):
            flatten(plain(obj), _numbered(PART_OF[m.group(1)], int(m.group(2) or 0)), state)
        else:
            flatten(plain(obj), f"{parts.EXTRA}.{path}", state)
    ranks = sorted(int(m.group(1)) for p in loaded if (m := _RNG.match(p)))
    result.layout.rank_files = {parts.RNG: ranks}
    _scheduler_steps(state, max(ranks) + 1 if ranks else 1, result.layout)
    if any(k.startswith(parts.DATALOADER + ".") for k in state):
        result.layout.never_saved.pop(parts.DATALOADER, None)
    if any(k.startswith(parts.TRAIN_STATE + ".") for k in state):
        result.layout.never_saved.pop(parts.TRAIN_STATE, None)
    return state


def _scheduler_steps(state: dict[str, Any], processes: int, layout: Any) -> None:
    """accelerate steps a prepared scheduler once per process at every optimizer step (unless
    ``split_batches``): its count is the step times the processes, so it is compared as that."""
    last = state.get(f"{parts.LR_SCHEDULER}.last_epoch")
    if not isinstance(last, int) or isinstance(last, bool):
        return
    layout.scheduler_per_step = False
    if last % processes == 0:
        layout.step_counters[
            f"lr_scheduler.last_epoch / {processes} processes" if processes > 1 else "lr_scheduler.last_epoch"
        ] = last // processes


def _numbered(part: str, index: int) -> str:
    return part if index == 0 else f"{parts.EXTRA}.{part}_{index}"


def _rng(obj: Any, rank: int, state: dict[str, Any], result: RestoreResult) -> None:
    from drill.formats.canonical import flatten

    if not isinstance(obj, dict):
        return
    names = {
        "random_state": "python",
        "numpy_random_seed": "numpy",
        "torch_manual_seed": "torch",
        "torch_cuda_manual_seed": "cuda",
    }
    for key, value in obj.items():
        if key == "step":
            state[f"{parts.EXTRA}.accelerate_step.rank_{rank}"] = (
                value  # gradient-accumulation boundaries, not optimizer steps
            )
        else:
            flatten(value, f"{parts.RNG}.rank_{rank}.{names.get(key, key)}", state)


def _custom(obj: Any, index: int, state: dict[str, Any]) -> None:
    """A registered object's ``state_dict()``: its step, where it names one, is the train state."""
    from drill.formats.canonical import flatten

    if isinstance(obj, dict):
        step = next(
            (obj[k] for k in _STEP_KEYS if isinstance(obj.get(k), int) and not isinstance(obj.get(k), bool)), None
        )
        if step is not None and f"{parts.TRAIN_STATE}.step" not in state:
            state[f"{parts.TRAIN_STATE}.step"] = step
    flatten(obj, f"{parts.EXTRA}.custom_checkpoint_{index}", state)


__all__ = ["Accelerate"]
