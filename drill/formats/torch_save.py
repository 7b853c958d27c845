"""Single-file ``torch.save`` checkpoints: nanoGPT-style dicts and Lightning ``.ckpt`` files."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

import torch

from drill import parts
from drill.discover import CheckpointRef
from drill.formats.canonical import Layout, flatten, inventory
from drill.formats.safeload import UnsafePickle, load_torch
from drill.integrity.structure import zip_structure
from drill.restore.progress import Progress
from drill.restore.result import FileRead, HashPlan, ItemFailure, RestoreResult
from drill.restore.stream import describe_read_error, read_whole
from drill.storage import Storage

LIGHTNING_MARKERS = ("pytorch-lightning_version", "optimizer_states")


def canonicalize_lightning(obj: dict[str, Any]) -> tuple[dict[str, Any], Layout]:
    state: dict[str, Any] = {}
    flatten(obj.get("state_dict", {}), parts.MODEL, state)
    optimizers = obj.get("optimizer_states") or []
    if len(optimizers) == 1:
        flatten(optimizers[0], parts.OPTIMIZER, state)
    elif optimizers:
        flatten({str(i): o for i, o in enumerate(optimizers)}, parts.OPTIMIZER, state)
    schedulers = obj.get("lr_schedulers") or []
    if len(schedulers) == 1:
        flatten(schedulers[0], parts.LR_SCHEDULER, state)
    elif schedulers:
        flatten({str(i): s for i, s in enumerate(schedulers)}, parts.LR_SCHEDULER, state)
    if "global_step" in obj:
        state[f"{parts.TRAIN_STATE}.step"] = obj["global_step"]
    if "epoch" in obj:
        state[f"{parts.TRAIN_STATE}.epoch"] = obj["epoch"]
    fit_loop = (obj.get("loops") or {}).get("fit_loop")
    if fit_loop is not None:
        flatten(fit_loop, parts.DATALOADER, state)
    for key in ("callbacks", "hyper_parameters", "hparams_name", "pytorch-lightning_version"):
        if key in obj:
            flatten(obj[key], f"{parts.EXTRA}.{key}", state)
    layout = Layout(
        format="lightning",
        required=(parts.MODEL, parts.OPTIMIZER, parts.TRAIN_STATE),
        recommended=(parts.LR_SCHEDULER, parts.DATALOADER, parts.RNG),
        optimizer_keys="index",
        scheduler_per_step=False,  # Lightning steps schedulers per epoch unless configured
        notes=["Lightning resumes data from the fit loop's progress counters; without a stateful "
               "loader it restarts the epoch's sampler rather than continuing mid-epoch"],
    )  # fmt: skip
    return state, layout


def canonicalize_dict(obj: dict[str, Any]) -> tuple[dict[str, Any], Layout]:
    """nanoGPT-style (``model``, ``optimizer``, ``iter_num``, …) or canonical top-level keys."""
    state: dict[str, Any] = {}
    for key, value in obj.items():
        if key in parts.CANONICAL_PARTS:
            flatten(value, key, state)
        elif key in ("iter_num", "step", "global_step", "iteration"):
            state[f"{parts.TRAIN_STATE}.step"] = value
        elif key in ("state_dict", "model_state_dict") and parts.MODEL not in obj:
            flatten(value, parts.MODEL, state)
        elif key in ("optimizer_state_dict",) and parts.OPTIMIZER not in obj:
            flatten(value, parts.OPTIMIZER, state)
        elif key in ("scheduler", "lr_scheduler_state_dict") and parts.LR_SCHEDULER not in obj:
            flatten(value, parts.LR_SCHEDULER, state)
        else:
            flatten(value, f"{parts.EXTRA}.{key}", state)
    layout = Layout(
        format="torch-save",
        required=(parts.MODEL, parts.OPTIMIZER, parts.TRAIN_STATE),
        recommended=(parts.LR_SCHEDULER, parts.DATALOADER, parts.RNG),
        optimizer_keys="index",
        scheduler_per_step=True,
    )
    return state, layout


def canonicalize(obj: Any) -> tuple[dict[str, Any], Layout]:
    if isinstance(obj, dict) and all(isinstance(v, torch.Tensor) for v in obj.values()):
        state: dict[str, Any] = {}
        flatten(obj, parts.MODEL, state)  # a bare state dict: weights only
        return state, Layout(format="torch-save", required=(parts.MODEL,), recommended=parts.CANONICAL_PARTS[1:])
    if isinstance(obj, dict) and any(k in obj for k in LIGHTNING_MARKERS):
        return canonicalize_lightning(obj)
    if isinstance(obj, dict):
        return canonicalize_dict(obj)
    return {f"{parts.EXTRA}.object": obj}, Layout(format="torch-save", required=(parts.MODEL,))


def restore_torch_save(
    storage: Storage,
    ref: CheckpointRef,
    device: torch.device,
    progress: Progress,
    plan: HashPlan,
    allow: Iterable[str] = (),
) -> RestoreResult:
    """Read the file once (hashing it as ``plan`` says), prove its zip structure, and load it
    onto ``device`` with ``weights_only=True``."""
    name = os.path.basename(ref.uri)
    result = RestoreResult(uri=ref.uri, format="torch-save", device=str(device))
    record = FileRead(name, None)
    result.files.append(record)
    started = time.perf_counter()
    try:
        record.size = storage.stat(ref.uri).size
        progress.phase("read", total_bytes=record.size)
        view, record.hashes = read_whole(
            storage, ref.uri, record.size, progress.advance, hash=plan.wants(name), chunk_size=plan.chunk_size
        )
        record.bytes_read = len(view)
    except (OSError, EOFError) as exc:
        record.error, record.error_kind = describe_read_error(exc)
        result.metadata_error = f"{name}: {exc}"
        return result
    finally:
        result.read_seconds += time.perf_counter() - started
    started = time.perf_counter()
    result.structure = zip_structure(view, name)
    try:
        obj = load_torch(view, allow, map_location=device)
    except UnsafePickle as exc:
        result.failures.append(ItemFailure(name, name, f"refused to unpickle: {exc}; nothing in it was executed", code="unsafe-pickle"))
        result.metadata_error = f"{name} was not loaded: it names {exc}"
        return result
    except Exception as exc:  # noqa: BLE001 - a damaged file is evidence
        result.metadata_error = f"{name} does not load: {type(exc).__name__}: {exc}".splitlines()[0]
        return result
    finally:
        result.load_seconds += time.perf_counter() - started
    state, layout = canonicalize(obj)
    if layout.format == "lightning":
        result.format = "lightning"
    if ref.step is not None:
        layout.step_counters["file name"] = ref.step
    result.layout = layout
    result.state = state
    result.inventory = inventory(state)
    record.items = len(state)
    result.tensors_loaded = sum(isinstance(v, torch.Tensor) for v in state.values())
    result.tensor_bytes = sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor))
    result.values_loaded = len(state) - result.tensors_loaded
    return result
