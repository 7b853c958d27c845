"""torchtune recipe checkpoints (``full_finetune_*``, through its HF checkpointer).

After every epoch a recipe saves the model's weights to ``<output_dir>/epoch_<N>/`` (safetensors
shards, their index, the model's config) and — while epochs remain — its resume state to one
file shared by every epoch, ``<output_dir>/recipe_state/recipe_state.pt``: the optimizer, the
seed, ``epochs_run``, ``total_epochs``, ``max_steps_per_epoch`` and the stateful data loader,
overwritten at each save. ``resume_from_checkpoint: True`` loads the highest ``epoch_<N>`` with
that recipe state. So the recipe state belongs to one epoch (``epochs_run == N + 1``): beside
an older epoch it no longer describes that epoch (its own was overwritten: that epoch is
weights only), and one older than the newest weights is a resume that pairs new weights with
an old optimizer and data position — a finding. The final epoch's save has no recipe state of
its own (training is complete). The recipe state's path is torchtune's, fixed: it is read at
``../recipe_state/recipe_state.pt`` of the epoch, never at a path the checkpoint names.
"""

from __future__ import annotations

import re
from typing import Any

from drill import parts
from drill.checkpoints import CheckpointRef, Discovery, IncompleteSave
from drill.findings import Finding, Severity
from drill.formats.base import RestoreContext, Structure
from drill.formats.bundle import INERT, JSON, SAFETENSORS, TORCH, Member
from drill.formats.safetensors_dir import SafetensorsDir
from drill.restore import RestoreResult
from drill.storage import Entry, Listing, Storage

RECIPE_STATE = "recipe_state/recipe_state.pt"
RECIPE_PATH = f"../{RECIPE_STATE}"
"""How the recipe state is named in a drill's evidence: beside the epoch, not inside it."""
_EPOCH = re.compile(r"^epoch_(\d+)\Z")
NEVER_SAVED = {
    parts.RNG: "torchtune's recipes save the seed, not the generators' states: a resume reseeds",
    parts.LR_SCHEDULER: "torchtune rebuilds its LR schedule from the step (last_epoch = global step - 1)",
}
RECIPE_NEEDED = (
    "torchtune keeps the optimizer, seed, epochs run and data loader there; resume_from_checkpoint fails without it"
)
ADAPTER = "adapter_model.pt"
"""The LoRA recipes' adapter weights in torchtune's names: what ``resume_from_checkpoint`` loads."""
ADAPTER_FILES = {ADAPTER: TORCH, "adapter_model.bin": TORCH, "adapter_model.safetensors": SAFETENSORS,
                 "adapter_config.json": JSON}  # fmt: skip
"""What a LoRA recipe saves beside the merged weights (the PEFT copies are for inference)."""
ADAPTER_NEEDED = "torchtune's LoRA resume loads the adapter weights from it; the merged weights cannot be split back"


class TorchTune(SafetensorsDir):
    """torchtune ``epoch_<N>/`` checkpoints with their recipe state (see the module's docstring)."""

    name = "torchtune"
    label = "torchtune recipe checkpoint (epoch_N + recipe_state.pt)"
    marker = "model.safetensors.index.json"

    def recognize(
        self, storage: Storage, uri: str, name: str, entries: Listing
    ) -> CheckpointRef | IncompleteSave | None:
        m = _EPOCH.match(name)
        if m is None:
            return None
        found = super().recognize(storage, uri, name, entries)
        if isinstance(found, CheckpointRef):
            return CheckpointRef(
                uri=uri, name=name, step=None, format=self.name, mtime=found.mtime
            )  # an epoch is not a step: ordered by time
        if found is not None or entries:
            return IncompleteSave(
                uri,
                name,
                None,
                "torchtune writes model.safetensors.index.json after the epoch's shards, and it is missing: the save never finished",
            )
        return None

    def is_export(self, ref: CheckpointRef, entries: list[Entry]) -> bool:
        return False

    def pointers(
        self, storage: Storage, root: str, entries: dict[str, Entry], found: Discovery
    ) -> list[tuple[str, str]]:
        """``resume_from_checkpoint: True``: the highest ``epoch_<N>`` (and the one recipe state)."""
        epochs = [(int(m.group(1)), c.name) for c in found.saves if (m := _EPOCH.match(c.name))]
        return (
            [("torchtune's resume_from_checkpoint", max(epochs)[1])]
            if epochs and any(c.format == self.name for c in found.checkpoints)
            else []
        )

    def every_save(self, name: str) -> bool:
        """The weights, their index and a LoRA recipe's adapter files: written at every epoch."""
        return name in ADAPTER_FILES or name.endswith(".safetensors") or name.endswith(".index.json")

    def members(self, sizes: dict[str, int]) -> list[Member]:
        weights = [m for m in super().members(sizes) if m.path not in ADAPTER_FILES]
        return weights + [Member(p, kind, sizes[p]) for p, kind in ADAPTER_FILES.items() if p in sizes]

    def structure(
        self, storage: Storage, uri: str, sizes: dict[str, int], allow_classes: tuple[str, ...] = ()
    ) -> Structure | None:
        from drill.formats import bundle
        from drill.formats.bundle import file_structure
        from drill.formats.inert import load_inert
        from drill.integrity.reading import read_whole

        findings, evidence = super().structure(storage, uri, sizes, allow_classes) or ([], {})
        adapters = [
            Member(p, kind, sizes[p]) for p, kind in ADAPTER_FILES.items() if p in sizes and kind != SAFETENSORS
        ]
        findings += (bundle.structure(storage, uri, sizes, adapters) or ([], {}))[0]
        findings += [_adapter_missing()] if _adapter_lost(sizes) else []
        recipe = _recipe_uri(storage, uri)
        try:
            view = read_whole(storage, recipe, storage.stat(recipe).size, hash=False).view
        except (OSError, EOFError):
            return findings + [_recipe_finding("file-missing", f"{RECIPE_PATH} is missing: {RECIPE_NEEDED}")], evidence
        findings += [_renamed(f) for f in file_structure(RECIPE_STATE, view)]
        try:
            state, _ = load_inert(view)
        except Exception:  # noqa: BLE001 - its structure above says what is wrong with it
            return findings, evidence
        match, why = _match(_epoch(uri), state, _saved_epochs(storage, uri))
        evidence["recipe_state"] = match
        return findings + ([_recipe_finding(_CODES[match], why)] if match in _CODES else []), evidence

    def layout(self, ref: CheckpointRef) -> Any:
        from drill.formats.canonical import Layout

        return Layout(
            format=self.name,
            required=(parts.MODEL, parts.OPTIMIZER, parts.DATALOADER, parts.TRAIN_STATE),
            never_saved=dict(NEVER_SAVED),
            optimizer_keys="index",
            scheduler_per_step=False,
            must_hold={parts.TRAIN_STATE: ("epoch",)},
            recognized=f"torchtune recipe checkpoint: {ref.name}'s weights with {RECIPE_PATH}",
            save_hint="torchtune saves it in recipe_state.pt while epochs remain: was the file deleted, or the run saved with intermediate checkpoints off?",
        )

    def canonical(
        self,
        loaded: dict[str, Any],
        sizes: dict[str, int],
        result: RestoreResult,
        storage: Storage,
        ref: CheckpointRef,
        ctx: RestoreContext,
    ) -> dict[str, Any]:
        from drill.formats.base import read_file
        from drill.formats.bundle import file_structure, load_member

        state = super().canonical(
            {p: v for p, v in loaded.items() if p not in ADAPTER_FILES}, sizes, result, storage, ref, ctx
        )
        _adapters(loaded, state)
        if _adapter_lost(sizes):
            result.layout.missing_files[ADAPTER] = ADAPTER_NEEDED
        view = read_file(storage, _run_dir(ref.uri), RECIPE_STATE, None, ctx, result)
        record = result.files[-1]
        record.relative_path = RECIPE_PATH
        if view is None:
            if record.error_kind == "missing":
                result.layout.missing_files[RECIPE_PATH] = RECIPE_NEEDED
            return state
        result.structure[0].extend(_renamed(f) for f in file_structure(RECIPE_STATE, view))
        try:
            recipe = load_member(Member(RECIPE_PATH, INERT, len(view)), view, ctx, result)
        except Exception as exc:  # noqa: BLE001 - a damaged recipe state is evidence
            from drill.formats.bundle import member_failure

            result.failures.append(member_failure(RECIPE_PATH, exc))
            return state
        record.items = 1
        self._recipe(recipe, _epoch(ref.uri), _saved_epochs(storage, ref.uri), state, result)
        return state

    @staticmethod
    def _recipe(recipe: Any, epoch: int, saved: set[int], state: dict[str, Any], result: RestoreResult) -> None:
        from drill.formats.canonical import flatten
        from drill.formats.inert import plain

        match, why = _match(epoch, recipe, saved)
        result.layout.notes.append(why)
        if match in _CODES:
            result.structure[0].append(_recipe_finding(_CODES[match], why))
        elif match in ("older", "final"):
            for part in (parts.OPTIMIZER, parts.DATALOADER, parts.TRAIN_STATE):
                result.layout.never_saved[part] = why
            result.layout.required = (parts.MODEL,)
            return
        if not isinstance(recipe, dict):
            return
        # A part the recipe state lacks stays absent (a required part missing), never an empty one.
        for key, part in (("optimizer", parts.OPTIMIZER), ("dataloader", parts.DATALOADER)):
            if recipe.get(key):
                flatten(plain(recipe[key]), part, state)
        epochs_run = recipe.get("epochs_run")
        if recipe.get("dataloader"):
            state[f"{parts.DATALOADER}.seed"] = recipe.get("seed")
            state[f"{parts.DATALOADER}.epoch"] = epochs_run
        # Epochs are its counter: the global step is rebuilt from the loader's length, gradient
        # accumulation and max_steps_per_epoch on resume, none of which the state says whole.
        state[f"{parts.TRAIN_STATE}.epoch"] = epochs_run
        for key in ("seed", "total_epochs", "max_steps_per_epoch"):
            state[f"{parts.EXTRA}.{key}"] = recipe.get(key)


def _adapter_lost(sizes: dict[str, int]) -> bool:
    """A LoRA save (its other adapter files are there) without the adapter weights its resume loads."""
    return ADAPTER not in sizes and any(p in sizes for p in ADAPTER_FILES)


def _adapter_missing() -> Finding:
    return Finding(
        check="integrity", code="file-missing", severity=Severity.ERROR, subject=ADAPTER,
        message=f"{ADAPTER} is missing: {ADAPTER_NEEDED}",
    )  # fmt: skip


def _adapters(loaded: dict[str, Any], state: dict[str, Any]) -> None:
    """The adapter in torchtune's names is part of the model (what the optimizer's LoRA
    parameters are); PEFT's copy and the config are kept beside it."""
    from drill.formats.canonical import flatten

    if isinstance(adapter := loaded.get(ADAPTER), dict):
        flatten(adapter, parts.MODEL, state)
    for path in ADAPTER_FILES:
        if path != ADAPTER and path in loaded:
            flatten(loaded[path], f"{parts.EXTRA}.{path.rsplit('.', 1)[0]}", state)


def _epoch(uri: str) -> int:
    m = _EPOCH.match(uri.rstrip("/").rsplit("/", 1)[-1])
    return int(m.group(1)) if m else -1


def _run_dir(uri: str) -> str:
    """The run's output directory: the epoch's parent (a path or an object-store prefix)."""
    return uri.rstrip("/").rsplit("/", 1)[0]


def _recipe_uri(storage: Storage, uri: str) -> str:
    return storage.child(_run_dir(uri), RECIPE_STATE)


def _saved_epochs(storage: Storage, uri: str) -> set[int]:
    """The epochs whose weights the run directory holds (``epoch_<N>/``)."""
    try:
        return {int(m.group(1)) for e in storage.list(_run_dir(uri)) if e.is_dir and (m := _EPOCH.match(e.name))}
    except OSError:
        return set()


def _match(epoch: int, recipe: Any, saved: set[int]) -> tuple[str, str]:
    """Whose recipe state this is, for the weights of ``epoch``: ``matched``, ``final`` (the last
    epoch saves none), ``older`` (it was overwritten by a later epoch's, whose weights are in
    ``saved``), ``ahead`` (it claims epochs whose weights were never saved) or ``stale``."""
    run = recipe.get("epochs_run") if isinstance(recipe, dict) else None
    total = recipe.get("total_epochs") if isinstance(recipe, dict) else None
    if not isinstance(run, int) or isinstance(run, bool):
        return "stale", f"{RECIPE_PATH} names no epochs_run: it cannot be matched to epoch_{epoch}"
    if run < 1:  # torchtune saves it after an epoch: at least one ran
        return "stale", (
            f"{RECIPE_PATH} says epochs_run={run}, which no saved recipe state says (it is saved after an epoch): "
            f"it cannot be matched to epoch_{epoch}"
        )
    if run == epoch + 1:
        return "matched", f"{RECIPE_PATH} is epoch_{epoch}'s (epochs_run={run})"
    if run == epoch and total == epoch + 1:
        return "final", f"epoch_{epoch} is the final epoch's save: weights only, training is complete"
    if run > epoch + 1 and run - 1 not in saved:
        newest = max(saved, default=epoch)
        return "ahead", (
            f"{RECIPE_PATH} says {run} epochs ran (epochs_run={run}), but the newest weights saved are epoch_{newest}'s: "
            f"a resume would pair epoch_{newest}'s weights with the state of an epoch never saved and skip the epochs between"
        )
    if run > epoch + 1:
        return (
            "older",
            f"{RECIPE_PATH} is now epoch_{run - 1}'s (epochs_run={run}): epoch_{epoch}'s own resume state was overwritten, so epoch_{epoch} is weights only (torchtune resumes from the newest epoch)",
        )
    return "stale", (
        f"{RECIPE_PATH} is older than these weights: it was saved after epoch {run - 1} (epochs_run={run}), the weights after epoch {epoch}; "
        f"a resume would pair epoch_{epoch}'s weights with an older optimizer and data position and train epoch(s) again"
    )


_CODES = {"stale": "recipe-state-stale", "ahead": "recipe-state-ahead"}
"""The recipe states a resume must not take, and their finding codes."""


def _recipe_finding(code: str, message: str) -> Finding:
    return Finding(check="integrity", code=code, severity=Severity.ERROR, subject=RECIPE_PATH, message=message)


def _renamed(f: Finding) -> Finding:
    from dataclasses import replace

    return replace(f, subject=RECIPE_PATH) if f.subject == RECIPE_STATE else f


__all__ = ["RECIPE_STATE", "TorchTune"]
