"""Find the checkpoints a training run has retained under its root.

A *checkpoint* is a complete save. A directory that looks like a save but lacks its commit
marker (DCP writes ``.metadata`` last, Hugging Face's Trainer ``trainer_state.json``) is an
*incomplete save*: reported, never selected. Files beside the checkpoints that a trainer
writes at the end of a run (Hugging Face's ``save_model``/``save_state``: ``model.safetensors``,
``trainer_state.json``, ``config.json``) are a *final export*: weights, not a resumable
checkpoint, and reported as such.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from drill.storage import Entry, EntryKind, Storage

DCP_METADATA = ".metadata"
HF_TRAINER_STATE = "trainer_state.json"
"""Hugging Face's Trainer writes it after the model, optimizer, scheduler and RNG files."""
SINGLE_FILE_SUFFIXES = (".pt", ".pth", ".ckpt", ".tar")
DCP_SHARD_SUFFIX = ".distcp"
MEGATRON_COMMON, MEGATRON_CONFIG = "common.pt", "metadata.json"
"""Megatron-core's dist_checkpointing writes ``common.pt``, then the shards and ``.metadata``,
then ``metadata.json`` last: a directory with the first but not the last is an incomplete save."""
EXPORT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "config.json", HF_TRAINER_STATE, "training_args.bin")
"""What Hugging Face's ``save_model``/``save_state`` leave at the top of an output directory."""

# torchtitan writes step-N; other trainers use checkpoint-N, iter_N, global_stepN.
_STEP_DIR = re.compile(r"^(?:step|checkpoint|iter|global_step)[-_]?(\d+)$")
# Single files: Lightning's "epoch=0-step=400.ckpt", "step_400.pt", "iter-400.pt".
_STEP_FILE = re.compile(r"(?:^|[-_])(?:step|iter|global_step)[=_-]?(\d+)(?:\.|$)")


@dataclass(frozen=True, slots=True)
class CheckpointRef:
    uri: str
    name: str
    step: int | None
    format: str
    mtime: float


@dataclass(frozen=True, slots=True)
class IncompleteSave:
    uri: str
    name: str
    step: int | None
    reason: str


@dataclass(slots=True)
class Discovery:
    root: str
    checkpoints: list[CheckpointRef] = field(default_factory=list)
    """Complete saves, oldest step first."""
    incomplete: list[IncompleteSave] = field(default_factory=list)
    exports: list[str] = field(default_factory=list)
    """Files of a final model export beside the checkpoints: not resumable, not drilled."""

    @property
    def steps(self) -> list[int]:
        return [c.step for c in self.checkpoints if c.step is not None]


def step_of(name: str) -> int | None:
    m = _STEP_DIR.match(name)
    if m:
        return int(m.group(1))
    m = _STEP_FILE.search(name)
    return int(m.group(1)) if m and name.endswith(SINGLE_FILE_SUFFIXES) else None


def looks_like_checkpoint_name(name: str) -> bool:
    return _STEP_DIR.match(name) is not None


def inspect_dir(storage: Storage, uri: str, name: str, entries: list[Entry] | None = None) -> CheckpointRef | IncompleteSave | None:
    """Classify one directory: a complete save, an incomplete save, or neither."""
    step = step_of(name)
    names = {e.name: e for e in (entries if entries is not None else storage.list(uri))}
    if DCP_METADATA in names and MEGATRON_COMMON in names and MEGATRON_CONFIG not in names:
        reason = f"Megatron save with {MEGATRON_COMMON} and {DCP_METADATA} but no {MEGATRON_CONFIG}, which dist_checkpointing writes last: the save never finished"
        return IncompleteSave(uri=uri, name=name, step=step, reason=reason)
    for marker, fmt in ((DCP_METADATA, "dcp"), (HF_TRAINER_STATE, "hf-trainer")):
        if marker in names and names[marker].is_file:
            return CheckpointRef(uri=uri, name=name, step=step, format=fmt, mtime=names[marker].mtime)
    if any(n.endswith(DCP_SHARD_SUFFIX) for n in names):
        return IncompleteSave(uri=uri, name=name, step=step, reason=f"DCP shards but no {DCP_METADATA}: the save never finished")
    if step is not None:
        reason = f"no {DCP_METADATA} or {HF_TRAINER_STATE}: the save never finished" if names else "empty directory"
        return IncompleteSave(uri=uri, name=name, step=step, reason=reason)
    return None


RESUME_FILES = ("optimizer.pt", "scheduler.pt", "rng_state.pth")


def _final_export(ref: CheckpointRef, entries: list[Entry]) -> bool:
    """A directory with Hugging Face's trainer_state.json but no step in its name and none of
    the files a resume reads (optimizer, scheduler, RNG): ``save_model``/``save_state`` output."""
    names = {e.name for e in entries}
    return ref.format == "hf-trainer" and ref.step is None and not (names & set(RESUME_FILES)) and not any(n.startswith("rng_state") for n in names)


def _single_file(entry: Entry) -> CheckpointRef:
    return CheckpointRef(uri=entry.uri, name=entry.name, step=step_of(entry.name), format="torch-save", mtime=entry.mtime)


def discover(storage: Storage, root: str) -> Discovery:
    """List the complete and incomplete saves directly under ``root`` (or ``root`` itself
    when it is one checkpoint and holds none).

    Raises ``FileNotFoundError``/``NotADirectoryError`` when the root itself is unusable.
    """
    root_entry = storage.stat(root)
    found = Discovery(root=root)
    if not root_entry.is_dir:
        if root_entry.is_file and root_entry.name.endswith(SINGLE_FILE_SUFFIXES):
            found.checkpoints.append(_single_file(root_entry))
            return found
        raise NotADirectoryError(20, "Not a directory", root)
    entries = storage.list(root)
    for entry in entries:
        if entry.is_dir:
            _add_dir(storage, entry, found)
        elif entry.kind in (EntryKind.DANGLING, EntryKind.LOOP) and step_of(entry.name) is not None:
            why = "a symlink that leads back into itself" if entry.kind is EntryKind.LOOP else "a symlink to nothing"
            found.incomplete.append(IncompleteSave(entry.uri, entry.name, step_of(entry.name), f"{why}: no save behind it"))
    if not found.checkpoints and not found.incomplete:
        # ``drill run --root step-40``: the root is itself one checkpoint (its *.pt files are
        # parts of it, not checkpoints of their own).
        itself = inspect_dir(storage, root, root_entry.name, entries)
        if isinstance(itself, CheckpointRef) and not _final_export(itself, entries):
            found.checkpoints.append(itself)
            return found
        if isinstance(itself, IncompleteSave):
            found.incomplete.append(itself)
            if any(e.name.endswith(DCP_SHARD_SUFFIX) or e.name == DCP_METADATA for e in entries):
                return found  # an unfinished DCP save: its common.pt is part of it, not a checkpoint
    found.checkpoints += [_single_file(e) for e in entries if e.is_file and e.name.endswith(SINGLE_FILE_SUFFIXES) and e.size > 0]
    found.exports = sorted(e.name for e in entries if e.is_file and e.name in EXPORT_FILES)
    # Oldest first: by step, and by time for files that carry no step in their name.
    found.checkpoints.sort(key=lambda c: (c.step if c.step is not None else -1, c.mtime, c.name))
    found.incomplete.sort(key=lambda c: (c.step if c.step is not None else -1, c.name))
    return found


def _add_dir(storage: Storage, entry: Entry, found: Discovery) -> None:
    try:
        kind = inspect_dir(storage, entry.uri, entry.name)
    except OSError as exc:  # unreadable, a loop below it, an I/O error: this save, not the run
        found.incomplete.append(IncompleteSave(entry.uri, entry.name, step_of(entry.name), f"unreadable: {exc.strerror or exc}"))
        return
    if isinstance(kind, CheckpointRef):
        found.checkpoints.append(kind)
    elif isinstance(kind, IncompleteSave):
        found.incomplete.append(kind)


@dataclass(frozen=True, slots=True)
class PathKind:
    """What a path given as "a checkpoint" really is (for ``drill verify`` and ``drill seal``)."""

    kind: str
    """``checkpoint``, ``incomplete``, ``run-root``, ``file``, ``empty`` or ``directory``
    (files in no layout drill knows)."""
    ref: CheckpointRef | None = None
    incomplete: IncompleteSave | None = None
    discovery: Discovery | None = None


def classify(storage: Storage, uri: str) -> PathKind:
    """Raises ``FileNotFoundError`` when nothing is there."""
    entry = storage.stat(uri)
    if not entry.is_dir:
        return PathKind("file")
    found = discover(storage, uri)
    if len(found.checkpoints) == 1 and found.checkpoints[0].uri == uri:
        return PathKind("checkpoint", ref=found.checkpoints[0])
    if found.checkpoints or len(found.incomplete) > 1 or (found.incomplete and found.incomplete[0].uri != uri):
        return PathKind("run-root", discovery=found)
    if found.incomplete:
        return PathKind("incomplete", incomplete=found.incomplete[0])
    return PathKind("directory" if storage.list(uri) else "empty")
