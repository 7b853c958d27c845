"""Hugging Face Trainer ``checkpoint-N/`` directories.

Files: ``model.safetensors`` (or a sharded index and its shards, or ``pytorch_model.bin``),
``optimizer.pt``, ``scheduler.pt``, ``rng_state.pth`` (``rng_state_{rank}.pth`` when more than
one process trained), ``trainer_state.json`` (written last: its presence marks a complete
save) and ``training_args.bin`` (a pickled ``TrainingArguments``: loaded only when the policy
allow-lists that class).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from typing import Any

import torch

from drill import parts
from drill.discover import CheckpointRef
from drill.findings import Finding
from drill.formats.canonical import Layout, flatten, inventory
from drill.formats.safeload import NUMPY_ARRAYS, UnsafePickle, load_safetensors, load_torch
from drill.integrity.structure import safetensors_structure, zip_structure
from drill.restore.progress import Progress
from drill.restore.result import FileRead, HashPlan, ItemFailure, RestoreResult
from drill.restore.stream import describe_read_error, read_whole
from drill.storage import Storage

TRAINER_STATE = "trainer_state.json"
TRAINING_ARGS = "training_args.bin"
_RNG = re.compile(r"^rng_state(?:_(\d+))?\.pth$")
_PICKLED = (".pt", ".pth", ".bin")


def _part_of(name: str) -> tuple[str, int | None] | None:
    if name == "optimizer.pt":
        return parts.OPTIMIZER, None
    if name == "scheduler.pt":
        return parts.LR_SCHEDULER, None
    if m := _RNG.match(name):
        return parts.RNG, int(m.group(1)) if m.group(1) is not None else None
    if name.endswith(".safetensors") or name in ("pytorch_model.bin",) or re.match(r"^pytorch_model-\d+-of-\d+\.bin$", name):
        return parts.MODEL, None
    return None


def restore_hf(
    storage: Storage,
    ref: CheckpointRef,
    device: torch.device,
    progress: Progress,
    plan: HashPlan,
    allow: Iterable[str] = (),
) -> RestoreResult:
    """Read every file of the checkpoint once and load each part onto ``device``."""
    result = RestoreResult(uri=ref.uri, format="hf-trainer", device=str(device))
    entries = {e.name: e for e in storage.list(ref.uri) if not e.is_dir}
    names = sorted(n for n in entries if _part_of(n) or n in (TRAINER_STATE, TRAINING_ARGS))
    progress.phase("read", total_bytes=sum(entries[n].size for n in names))
    allow = tuple(allow)
    state: dict[str, Any] = {}
    rng_ranks: list[int] = []
    structure: list[Finding] = []
    trainer_state: dict[str, Any] = {}
    training_args: Any = None
    for name in names:
        record = FileRead(name, entries[name].size)
        result.files.append(record)
        started = time.perf_counter()
        try:
            uri = storage.child(ref.uri, name)
            view, record.hashes = read_whole(
                storage, uri, entries[name].size, progress.advance, hash=plan.wants(name), chunk_size=plan.chunk_size
            )
            record.bytes_read = len(view)
        except (OSError, EOFError) as exc:
            record.error, record.error_kind = describe_read_error(exc)
            continue
        finally:
            result.read_seconds += time.perf_counter() - started
        started = time.perf_counter()
        try:
            if name.endswith(".safetensors"):
                structure += safetensors_structure(view, name)[0]
            elif name.endswith(_PICKLED):
                structure += zip_structure(view, name)[0]
            before = len(state)
            if name == TRAINER_STATE:
                trainer_state = json.loads(bytes(view))
            elif name == TRAINING_ARGS:
                training_args = _load_training_args(view, allow, result)
            else:
                part, rank = _part_of(name)  # type: ignore[misc]
                if name.endswith(".safetensors"):
                    flatten(load_safetensors(view, device), part, state)
                else:
                    extra = NUMPY_ARRAYS if part == parts.RNG else ()
                    obj = load_torch(view, (*allow, *extra), map_location=device)
                    prefix = f"{part}.rank_{rank}" if part == parts.RNG and rank is not None else part
                    flatten(obj, prefix, state)
                if part == parts.RNG and rank is not None:
                    rng_ranks.append(rank)
            record.items = len(state) - before
        except UnsafePickle as exc:
            result.failures.append(
                ItemFailure(name, name, f"refused to unpickle: {exc}; nothing in it was executed", code="unsafe-pickle")
            )
        except Exception as exc:  # noqa: BLE001 - a damaged file is evidence
            result.failures.append(ItemFailure(name, name, f"{type(exc).__name__}: {exc}".splitlines()[0]))
        finally:
            result.load_seconds += time.perf_counter() - started

    global_step = trainer_state.get("global_step")
    if global_step is not None:
        state[f"{parts.TRAIN_STATE}.step"] = global_step
        state[f"{parts.TRAIN_STATE}.epoch"] = trainer_state.get("epoch")
        # HF resumes data by replaying the seeded sampler and skipping the batches of the
        # current epoch already consumed: the position is global_step, the order the seed.
        state[f"{parts.DATALOADER}.global_step"] = global_step
        state[f"{parts.DATALOADER}.epoch"] = trainer_state.get("epoch")
        seed = getattr(training_args, "data_seed", None) or getattr(training_args, "seed", None)
        if seed is not None:
            state[f"{parts.DATALOADER}.seed"] = seed
    layout = Layout(
        format="hf-trainer",
        required=(parts.MODEL, parts.OPTIMIZER, parts.LR_SCHEDULER, parts.RNG, parts.TRAIN_STATE),
        recommended=(parts.DATALOADER,),
        optimizer_keys="index",
        scheduler_per_step=True,
        rank_files={parts.RNG: sorted(rng_ranks)} if rng_ranks else {},
        multi_rank=bool(rng_ranks),
    )
    if global_step is not None:
        layout.step_counters["trainer_state.json global_step"] = int(global_step)
    if ref.step is not None:
        layout.step_counters["directory name"] = ref.step
    if training_args is None:
        layout.notes.append(
            f"{TRAINING_ARGS} was not loaded (allow-list transformers.training_args.TrainingArguments to read the "
            "sampler seed from it); the data order is taken to follow the run's seed"
        )
    result.layout = layout
    result.structure = (structure, {"files": len(names)})
    result.state = state
    ranks = {k: int(k.split(".")[1][len("rank_") :]) for k in state if k.startswith(f"{parts.RNG}.rank_")}
    result.inventory = inventory(state, ranks)
    result.tensors_loaded = sum(isinstance(v, torch.Tensor) for v in state.values())
    result.tensor_bytes = sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor))
    result.values_loaded = len(state) - result.tensors_loaded
    return result


def _load_training_args(view: memoryview, allow: tuple[str, ...], result: RestoreResult) -> Any:
    if not allow:
        return None
    try:
        return load_torch(view, allow)
    except UnsafePickle:
        return None
    except Exception:  # noqa: BLE001
        return None


__all__ = ["TRAINER_STATE", "restore_hf"]
