"""Single-file ``torch.save`` checkpoints: nanoGPT-style dicts and Lightning ``.ckpt`` files.

Any non-empty ``*.pt``, ``*.pth``, ``*.ckpt`` or ``*.tar`` at a run's top is one (the file is
the commit: ``torch.save`` writes it whole); its structure is the zip archive's central
directory and every record's CRC-32; a Lightning layout inside it is recognized by its keys
(``--format lightning`` forces it).
"""

from __future__ import annotations

import time
from typing import Any

from drill import parts
from drill.checkpoints import SINGLE_FILE_SUFFIXES, CheckpointRef, step_of
from drill.formats import state_view
from drill.formats.base import Format, RestoreContext, Structure, check_budget, one_line, read_file, tally
from drill.formats.canonical import Layout, flatten, inventory
from drill.integrity.structure import zip_structure
from drill.restore import ItemFailure, RestoreResult
from drill.storage import Entry, Storage

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
        save_hint="Lightning saves it unless ModelCheckpoint(save_weights_only=True): save full checkpoints to resume",
        notes=["Lightning resumes data from the fit loop's progress counters; without a stateful "
               "loader it restarts the epoch's sampler rather than continuing mid-epoch"],
    )  # fmt: skip
    return state, layout


def canonicalize_dict(obj: dict[str, Any]) -> tuple[dict[str, Any], Layout]:
    """nanoGPT-style (``model``, ``optimizer``, ``iter_num``, …) or canonical top-level keys."""
    state: dict[str, Any] = {}
    import torch

    for key, value in obj.items():
        if key == parts.RNG and isinstance(value, torch.Tensor):
            state[f"{parts.RNG}.torch"] = value  # torch.get_rng_state(): the CPU generator's state, saved bare
        elif key in parts.CANONICAL_PARTS:
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
        save_hint="put it in the dict passed to torch.save (e.g. optimizer.state_dict() under 'optimizer')",
    )
    return state, layout


def canonicalize(obj: Any) -> tuple[dict[str, Any], Layout]:
    import torch

    if isinstance(obj, dict) and all(isinstance(v, torch.Tensor) for v in obj.values()):
        state: dict[str, Any] = {}
        flatten(obj, parts.MODEL, state)  # a bare state dict: weights only
        bare = Layout(format="torch-save", required=(parts.MODEL,), recommended=parts.CANONICAL_PARTS[1:])
        bare.save_hint = "a bare state dict holds weights only: save a dict with model, optimizer and step to resume"
        return state, bare
    if isinstance(obj, dict) and any(k in obj for k in LIGHTNING_MARKERS):
        return canonicalize_lightning(obj)
    from drill import formats

    for fmt in formats.registered():  # a writer's file renamed: known by its shape
        view = fmt.view_of(obj)
        if view is not None:
            return view
    if isinstance(obj, dict):
        state, layout = canonicalize_dict(obj)
        if any(k.startswith(parts.MODEL + ".") for k in state):
            return state, layout
        # No key drill knows names the weights: a writer of its own, its state found by shape.
        return state_view.view(obj, format="torch-save")
    other = Layout(
        format="torch-save",
        required=(parts.MODEL,),
        save_hint=f"the file holds a {type(obj).__name__}, not a state dict",
    )
    return {f"{parts.EXTRA}.object": obj}, other


class TorchSave(Format):
    """A single ``torch.save`` file; a Lightning layout inside it is recognized by its keys."""

    name = "torch-save"
    label = "torch.save file (nanoGPT-style, Lightning .ckpt)"
    canonicalize = staticmethod(canonicalize)

    def recognize_file(self, entry: Entry) -> CheckpointRef | None:
        if not (entry.is_file and entry.name.endswith(SINGLE_FILE_SUFFIXES) and entry.size > 0):
            return None
        return CheckpointRef(
            uri=entry.uri, name=entry.name, step=step_of(entry.name), format=self.name, mtime=entry.mtime
        )

    def structure(
        self, storage: Storage, uri: str, sizes: dict[str, int], allow_classes: tuple[str, ...] = ()
    ) -> Structure | None:
        from drill.integrity.reading import read_whole

        ((name, size),) = sizes.items()
        return zip_structure(read_whole(storage, uri, size, hash=False).view, name)

    def restore(self, storage: Storage, ref: CheckpointRef, ctx: RestoreContext) -> RestoreResult:
        """Read the file once (hashed as the plan says), prove its zip structure, and load it
        onto the device with ``weights_only=True``."""
        name = ref.uri.rstrip("/").rsplit("/", 1)[-1]
        result = RestoreResult(uri=ref.uri, format=self.name, device=str(ctx.device))
        try:
            size: int | None = storage.stat(ref.uri).size
        except OSError:
            size = None
        ctx.progress.phase("read", total_bytes=size)
        view = read_file(storage, ref.uri, "", size, ctx, result)
        if view is None:
            result.metadata_error = f"{name}: {result.files[-1].error}"
            return result
        started = time.perf_counter()
        try:
            result.structure = zip_structure(view, name)
            obj = self._load(view, ctx, name, result)
        finally:
            result.load_seconds += time.perf_counter() - started
        if obj is None:
            return result
        try:
            state, layout = self.canonicalize(obj)
        except state_view.Unbounded as exc:
            result.metadata_error = f"{name} was not read: {exc}"
            return result
        result.format = layout.format
        if ref.step is not None:
            layout.step_counters["file name"] = ref.step
        result.layout, result.state, result.inventory = layout, state, inventory(state)
        result.files[-1].items = len(state)
        tally(result, state)
        return result

    @staticmethod
    def _load(view: memoryview, ctx: RestoreContext, name: str, result: RestoreResult) -> Any:
        from drill.formats.safeload import UnboundedArchive, UnsafePickle, check_archive, load_failure, load_torch

        try:
            need = check_archive(view)
        except UnboundedArchive as exc:
            result.failures.append(ItemFailure(name, name, str(exc), code=exc.code))
            result.metadata_error = f"{name} was not loaded: {exc}"
            return None
        except UnsafePickle:
            need = 0  # refused with its name just below
        check_budget(need, ctx)  # what the archive claims to hold, before anything is allocated
        try:
            return load_torch(view, ctx.allow_classes, map_location=ctx.device)
        except UnsafePickle as exc:
            if exc.code:  # code the trainer's own load would run: nothing of it is read
                result.failures.append(ItemFailure(name, name, exc.reason, code="unsafe-pickle"))
                result.metadata_error = f"{name} was not loaded: it names {exc}"
                return None
            obj = TorchSave._rest(view, ctx, name, result)
            rest = (
                "; the rest of the file was read with it as an inert stand-in, and checked" if obj is not None else ""
            )
            result.failures.append(ItemFailure(name, name, exc.reason + rest, code="unsafe-pickle"))
            return obj
        except Exception as exc:  # noqa: BLE001 - a damaged file is evidence
            code, why = load_failure(exc)
            result.metadata_error = f"{name} does not load: {why}"
            result.metadata_code = code if code == "pickle-bomb" else result.metadata_code
        return None

    @staticmethod
    def _rest(view: memoryview, ctx: RestoreContext, name: str, result: RestoreResult) -> Any:
        """A class outside the allow-list is a finding, not the end of the drill: the rest of
        the file is read with every class it names an inert stand-in (nothing constructed), and
        checked."""
        from drill.formats.inert import load_inert, plain

        try:
            obj, _ = load_inert(view, map_location=ctx.device)
        except Exception as exc:  # noqa: BLE001 - refused already; what else is wrong is evidence
            result.metadata_error = f"{name} was not loaded: {one_line(exc)}"
            return None
        return plain(obj)


class Lightning(TorchSave):
    """``--format lightning``: a Lightning ``.ckpt`` read with Lightning's layout, whatever its keys."""

    name = "lightning"
    label = "Lightning .ckpt (forced: --format lightning)"
    canonicalize = staticmethod(lambda obj: canonicalize_lightning(obj) if isinstance(obj, dict) else canonicalize(obj))

    def recognize_file(self, entry: Entry) -> CheckpointRef | None:
        return None  # a .ckpt is a torch-save file; its keys say Lightning (or --format does)
