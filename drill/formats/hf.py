"""Hugging Face Trainer ``checkpoint-N/`` directories.

Files: ``model.safetensors`` (or a sharded index and its shards, or ``pytorch_model.bin``),
``optimizer.pt``, ``scheduler.pt``, ``rng_state.pth`` (``rng_state_{rank}.pth`` when more than
one process trained), ``trainer_state.json`` (written last: its presence marks a complete
save) and ``training_args.bin`` (a pickled ``TrainingArguments``, read inert for its seeds:
no class of it is imported or constructed, so no allow-list — and no transformers import
billed as restore time — is needed whatever the transformers version).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from drill import formats, parts, safe_json
from drill.checkpoints import CheckpointRef, Discovery, IncompleteSave, step_of
from drill.findings import Finding, Severity
from drill.formats.base import (
    Format,
    RestoreContext,
    Structure,
    check_budget,
    one_line,
    read_file,
    restore_nested,
    restored_nested_structure,
    tally,
)
from drill.formats.canonical import Layout, flatten, inventory
from drill.restore import ItemFailure, RestoreResult
from drill.storage import Entry, Listing, Storage

TRAINER_STATE = "trainer_state.json"
TRAINING_ARGS = "training_args.bin"
EXPORT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "config.json",
    TRAINER_STATE,
    TRAINING_ARGS,
)
"""What Hugging Face's ``save_model``/``save_state`` leave at the top of an output directory."""
RESUME_FILES = ("optimizer.pt", "scheduler.pt", "rng_state.pth")
_RNG = re.compile(r"^rng_state(?:_(\d+))?\.pth\Z")
_CHECKPOINT = re.compile(r"^checkpoint-\d+\Z")
RNG_NEEDED = "the Trainer saves the RNG state with every checkpoint (rng_state.pth; rng_state_<rank>.pth with more processes) and restores it on resume"
_PICKLED = (".pt", ".pth", ".bin")
_PART_SUFFIXES = (*_PICKLED, ".safetensors")
"""What a Trainer's files end in (:func:`_part_of`, ``training_args.bin``)."""


def _part_of(name: str) -> tuple[str, int | None] | None:
    if name == "optimizer.pt":
        return parts.OPTIMIZER, None
    if name == "scheduler.pt":
        return parts.LR_SCHEDULER, None
    if m := _RNG.match(name):
        return parts.RNG, int(m.group(1)) if m.group(1) is not None else None
    if (
        name.endswith(".safetensors")
        or name in ("pytorch_model.bin",)
        or re.match(r"^pytorch_model-\d+-of-\d+\.bin$", name)
    ):
        return parts.MODEL, None
    return None


@dataclass(slots=True)
class _Read:
    """What the files said, beyond the tensors."""

    state: dict[str, Any] = field(default_factory=dict)
    rng_ranks: list[int] = field(default_factory=list)
    structure: list[Finding] = field(default_factory=list)
    trainer_state: dict[str, Any] = field(default_factory=dict)
    training_args: Any = None


class HFTrainer(Format):
    """Hugging Face Trainer ``checkpoint-N/`` directories: complete once ``trainer_state.json``
    (written last) is there; auto-resume (``get_last_checkpoint``) takes the highest
    ``checkpoint-N``, complete or not; ``save_model``/``save_state`` leave a final export at the
    output directory's top, which is not a checkpoint."""

    name = "hf-trainer"
    label = "Hugging Face Trainer"
    marker = TRAINER_STATE

    def recognize(
        self, storage: Storage, uri: str, name: str, entries: Listing
    ) -> CheckpointRef | IncompleteSave | None:
        state = entries.file(TRAINER_STATE)
        if state is not None:
            return CheckpointRef(uri=uri, name=name, step=step_of(name), format=self.name, mtime=state.mtime)
        if _CHECKPOINT.match(name) and any(
            _part_of(e.name) or e.name == TRAINING_ARGS for e in entries.suffixed(*_PART_SUFFIXES)
        ):
            return IncompleteSave(
                uri,
                name,
                step_of(name),
                f"the Trainer writes {TRAINER_STATE} after the weights, optimizer and RNG states, and it is missing: the save never finished",
            )
        return None

    def every_save(self, name: str) -> bool:
        """Its optimizer and scheduler (its RNG files are named by the world size, which a resume
        may change: the format checks them rank by rank)."""
        return name in ("optimizer.pt", "scheduler.pt")

    def is_export(self, ref: CheckpointRef, entries: list[Entry]) -> bool:
        """trainer_state.json but no step in the name and none of the files a resume reads:
        ``save_model``/``save_state`` output."""
        names = {e.name for e in entries}
        return (
            ref.step is None and not (names & set(RESUME_FILES)) and not any(n.startswith("rng_state") for n in names)
        )

    def exports(self, entries: list[Entry]) -> list[str]:
        return sorted(e.name for e in entries if e.is_file and e.name in EXPORT_FILES)

    def pointers(
        self, storage: Storage, root: str, entries: dict[str, Entry], found: Discovery
    ) -> list[tuple[str, str]]:
        """``get_last_checkpoint``: the highest ``checkpoint-N`` directory, complete or not."""
        named = [
            (s, c.name) for c in found.saves if c.name.startswith("checkpoint-") and (s := step_of(c.name)) is not None
        ]
        return [("Hugging Face's get_last_checkpoint", max(named)[1])] if named else []

    def structure(
        self, storage: Storage, uri: str, sizes: dict[str, int], allow_classes: tuple[str, ...] = ()
    ) -> Structure | None:
        from drill.formats.base import nested_structure

        proof = structure(storage, uri, sizes, allow_classes)
        subdirs = {p.split("/", 1)[0] for p in sizes if "/" in p}
        if not any(_RNG.match(p) for p in sizes) and (set(sizes) & {"optimizer.pt", "scheduler.pt"} or subdirs):
            from drill.integrity.structure import NAME

            missing = Finding(
                check=NAME,
                code="file-missing",
                severity=Severity.ERROR,
                subject="rng_state.pth",
                message=f"rng_state.pth is missing: {RNG_NEEDED}",
            )
            proof = (proof[0] + [missing], proof[1]) if proof is not None else ([missing], {})
        for subdir, fmt in formats.nested(storage, uri, [e for e in storage.list(uri) if e.name in subdirs]):
            sub = nested_structure(fmt, storage, uri, subdir, sizes, allow_classes)
            if sub is not None:
                proof = (proof[0] + sub[0], {**proof[1], **sub[1]}) if proof is not None else sub
        return proof

    def restore(self, storage: Storage, ref: CheckpointRef, ctx: RestoreContext) -> RestoreResult:
        """Read every file of the checkpoint once and load each part onto the device."""
        from drill.formats.safeload import UnsafePickle, load_failure

        result = RestoreResult(uri=ref.uri, format=self.name, device=str(ctx.device))
        entries = {e.name: e for e in storage.list(ref.uri) if e.is_file}
        names = _resumed_from(entries)
        check_budget(
            sum(entries[n].size for n in names if n != TRAINING_ARGS), ctx
        )  # the files hold at most their own bytes
        ctx.progress.phase("read", total_bytes=sum(entries[n].size for n in names))
        got = _Read()
        for name in names:
            view = read_file(storage, ref.uri, name, entries[name].size, ctx, result)
            if view is None:
                continue
            started = time.perf_counter()
            try:
                before = len(got.state)
                _load_file(name, view, ctx, got, result)
                result.files[-1].items = len(got.state) - before
            except UnsafePickle as exc:
                result.failures.append(ItemFailure(name, name, exc.reason, code="unsafe-pickle"))
            except Exception as exc:  # noqa: BLE001 - a damaged file is evidence
                code, reason = (
                    load_failure(exc)
                    if "Weights only" in str(exc)
                    else (getattr(exc, "code", "entry-not-loaded"), one_line(exc))
                )
                result.failures.append(ItemFailure(name, name, reason, code=code))
            finally:
                result.load_seconds += time.perf_counter() - started
        _train_state(got)
        result.layout = _layout(ref, got)
        if not any(_RNG.match(n) for n in entries) and (
            set(entries) & {"optimizer.pt", "scheduler.pt"} or storage_has_nested(storage, ref.uri)
        ):
            result.layout.missing_files["rng_state.pth"] = RNG_NEEDED
        result.structure = (got.structure, {"files": len(names)})
        for subdir, fmt in formats.nested(storage, ref.uri, storage.list(ref.uri)):
            _merge_nested(subdir, fmt, restore_nested(fmt, storage, ref, subdir, ctx, result), storage, got, result)
        result.state = got.state
        ranks = {k: int(k.split(".")[1][len("rank_") :]) for k in got.state if k.startswith(f"{parts.RNG}.rank_")}
        result.inventory = inventory(got.state, ranks)
        tally(result, got.state)
        return result


def storage_has_nested(storage: Storage, uri: str) -> bool:
    return any(e.is_dir for e in storage.list(uri))


def _merge_nested(
    subdir: str, fmt: Format, sub: RestoreResult, storage: Storage, got: _Read, result: RestoreResult
) -> None:
    """A checkpoint the Trainer had another library write inside its own (DeepSpeed's
    ``global_stepN/``: the optimizer's partitions and the scheduler, which the Trainer then does
    not save as optimizer.pt and scheduler.pt): the parts the Trainer's files lack come from it."""

    own = {k.split(".", 1)[0] for k in got.state}
    for key, value in sub.state.items():
        part = key.split(".", 1)[0]
        took = part in (parts.OPTIMIZER, parts.LR_SCHEDULER, parts.MODEL) and part not in own
        got.state[key if took else f"{parts.EXTRA}.{subdir}.{key}"] = value
    layout, theirs = result.layout, sub.layout
    if theirs is None:
        return
    if parts.OPTIMIZER not in own:
        layout.optimizer_keys, layout.flat_groups = theirs.optimizer_keys, theirs.flat_groups
        layout.saved_ranks = layout.saved_ranks or theirs.saved_ranks
    if parts.MODEL not in own:
        layout.params = theirs.params
    layout.step_counters.update({f"{subdir} {k}": v for k, v in theirs.step_counters.items() if k != "directory name"})
    step = sub.state.get(f"{parts.TRAIN_STATE}.step")
    if isinstance(step, int):
        layout.step_counters[f"{subdir} {fmt.label} step"] = step
    layout.missing_files.update({f"{subdir}/{n}": why for n, why in theirs.missing_files.items()})
    layout.notes += theirs.notes
    proof = restored_nested_structure(fmt, sub, storage, subdir)
    if proof is not None:
        result.structure[0].extend(proof[0])
        result.structure[1].update(proof[1])


def _file_structure(name: str, view: memoryview) -> list[Finding]:
    """One file's structural proof (:func:`drill.formats.bundle.file_structure`), held to what
    its name says the Trainer loads it as — the same in ``run`` and ``verify``."""
    from drill.formats.bundle import JSON, SAFETENSORS, TORCH, file_structure

    kind = SAFETENSORS if name.endswith(".safetensors") else TORCH if name.endswith(_PICKLED) else None
    return file_structure(name, view, JSON if name.endswith(".json") else kind)


def _resumed_from(names: Any) -> list[str]:
    """The files a resume reads, in the order the adapter reads them."""
    return sorted(n for n in names if _part_of(n) or n in (TRAINER_STATE, TRAINING_ARGS))


def structure(
    storage: Storage, uri: str, sizes: Mapping[str, int], allow_classes: tuple[str, ...] = ()
) -> tuple[list[Finding], dict[str, Any]] | None:
    """The structural proof of an unsealed Trainer checkpoint without loading it: every file a
    resume reads, checked as the restore checks it; None when it holds no file with a
    structure to check (nothing would be proven)."""
    from drill.integrity.reading import describe_read_error, read_whole
    from drill.integrity.structure import NAME

    findings: list[Finding] = []
    names = [n for n in _resumed_from(sizes) if n.endswith((".safetensors", ".json", *_PICKLED))]
    if not any(n.endswith((".safetensors", *_PICKLED)) for n in names):
        return None  # a JSON file that parses proves no byte a resume restores
    for name in names:
        try:
            view = read_whole(storage, storage.child(uri, name), sizes[name], hash=False).view
        except (OSError, EOFError) as exc:
            why, _ = describe_read_error(exc)
            findings.append(
                Finding(
                    check=NAME,
                    code="file-unreadable",
                    severity=Severity.ERROR,
                    subject=name,
                    message=f"{name} cannot be read ({why})",
                )
            )
            continue
        findings += _file_structure(name, view)
    return findings, {"files": len(names)}


def _load_file(name: str, view: memoryview, ctx: RestoreContext, got: _Read, result: RestoreResult) -> None:
    from drill.formats.safeload import NUMPY_ARRAYS, load_safetensors, load_torch

    got.structure += _file_structure(name, view)
    if name == TRAINER_STATE:
        doc = safe_json.loads(bytes(view))
        got.trainer_state = doc if isinstance(doc, dict) else {}
        return
    if name == TRAINING_ARGS:
        got.training_args = _load_training_args(view)
        return
    part, rank = _part_of(name)  # type: ignore[misc]
    if name.endswith(".safetensors"):
        flatten(load_safetensors(view, ctx.device), part, got.state)
    else:
        extra = NUMPY_ARRAYS if part == parts.RNG else ()
        obj = load_torch(view, (*ctx.allow_classes, *extra), map_location=ctx.device)
        flatten(obj, f"{part}.rank_{rank}" if part == parts.RNG and rank is not None else part, got.state)
    if part == parts.RNG and rank is not None:
        got.rng_ranks.append(rank)


def _train_state(got: _Read) -> None:
    """HF resumes data by replaying the seeded sampler and skipping the batches of the current
    epoch already consumed: the position is global_step, the order the seed."""
    global_step = got.trainer_state.get("global_step")
    if global_step is None:
        return
    got.state[f"{parts.TRAIN_STATE}.step"] = global_step
    got.state[f"{parts.TRAIN_STATE}.epoch"] = got.trainer_state.get("epoch")
    got.state[f"{parts.DATALOADER}.global_step"] = global_step
    got.state[f"{parts.DATALOADER}.epoch"] = got.trainer_state.get("epoch")
    args = got.training_args or {}
    seed = args.get("data_seed") if args.get("data_seed") is not None else args.get("seed")
    if seed is not None:
        got.state[f"{parts.DATALOADER}.seed"] = seed


def _layout(ref: CheckpointRef, got: _Read) -> Layout:
    layout = Layout(
        format="hf-trainer",
        required=(parts.MODEL, parts.OPTIMIZER, parts.LR_SCHEDULER, parts.RNG, parts.TRAIN_STATE),
        recommended=(parts.DATALOADER,),
        optimizer_keys="index",
        scheduler_per_step=True,
        rank_files={parts.RNG: sorted(got.rng_ranks)} if got.rng_ranks else {},
        multi_rank=bool(got.rng_ranks),
        save_hint="the Trainer writes optimizer.pt, scheduler.pt and rng_state*.pth with every checkpoint "
        "(save_only_model=False): was a file deleted, or the checkpoint copied without it?",
    )
    global_step = got.trainer_state.get("global_step")
    if isinstance(global_step, int):
        layout.step_counters["trainer_state.json global_step"] = global_step
    if ref.step is not None:
        layout.step_counters["directory name"] = ref.step
    if got.training_args is None:
        layout.notes.append(
            f"{TRAINING_ARGS} could not be read for its seeds; the data order is taken to follow the run's seed"
        )
    return layout


def _load_training_args(view: memoryview) -> dict[str, Any] | None:
    """TrainingArguments' fields, read inert (:mod:`drill.formats.inert`): its classes — and
    those of accelerate and torch it holds (``PartialState``, ``AcceleratorConfig``,
    ``torch.device``, the enums) — become stand-ins; nothing is imported or run."""
    from drill.formats.inert import load_inert

    try:
        obj, _ = load_inert(view)
    except Exception:  # noqa: BLE001 - the seed is a nicety; the file's absence is not a finding
        return None
    fields = getattr(obj, "fields", None)
    return {k: v for k, v in fields.items() if k in ("seed", "data_seed")} if fields else None


__all__ = ["TRAINER_STATE", "HFTrainer"]
