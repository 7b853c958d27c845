"""Find the checkpoints a training run has retained under its root.

A *checkpoint* is a complete save. A directory that looks like a save but lacks its commit
marker (DCP writes ``.metadata`` last) is an *incomplete save*: reported, never selected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from drill.storage import Storage

DCP_METADATA = ".metadata"
HF_TRAINER_STATE = "trainer_state.json"
"""Hugging Face's Trainer writes it after the model, optimizer, scheduler and RNG files."""
SINGLE_FILE_SUFFIXES = (".pt", ".pth", ".ckpt", ".tar")

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


def step_of(name: str) -> int | None:
    m = _STEP_DIR.match(name)
    if m:
        return int(m.group(1))
    m = _STEP_FILE.search(name)
    return int(m.group(1)) if m and name.endswith(SINGLE_FILE_SUFFIXES) else None


def looks_like_checkpoint_name(name: str) -> bool:
    return _STEP_DIR.match(name) is not None


def inspect_dir(storage: Storage, uri: str, name: str) -> CheckpointRef | IncompleteSave | None:
    """Classify one directory: a complete DCP save, an incomplete save, or neither."""
    step = step_of(name)
    names = {e.name: e for e in storage.list(uri)}
    if DCP_METADATA in names and not names[DCP_METADATA].is_dir:
        return CheckpointRef(uri=uri, name=name, step=step, format="dcp", mtime=names[DCP_METADATA].mtime)
    if HF_TRAINER_STATE in names and not names[HF_TRAINER_STATE].is_dir:
        return CheckpointRef(uri=uri, name=name, step=step, format="hf-trainer", mtime=names[HF_TRAINER_STATE].mtime)
    if step is not None:
        reason = f"no {DCP_METADATA} or {HF_TRAINER_STATE}: the save never finished" if names else "empty directory"
        return IncompleteSave(uri=uri, name=name, step=step, reason=reason)
    return None


def discover(storage: Storage, root: str) -> Discovery:
    """List the complete and incomplete saves directly under ``root``.

    Raises ``FileNotFoundError``/``NotADirectoryError`` when the root itself is unusable.
    """
    root_entry = storage.stat(root)
    found = Discovery(root=root)
    if not root_entry.is_dir:
        if root_entry.name.endswith(SINGLE_FILE_SUFFIXES):  # a single checkpoint file
            found.checkpoints.append(
                CheckpointRef(root, root_entry.name, step_of(root_entry.name), "torch-save", root_entry.mtime)
            )
            return found
        raise NotADirectoryError(20, "Not a directory", root)
    # The root may itself be one checkpoint (``drill run --root step-40``).
    itself = inspect_dir(storage, root, root_entry.name)
    if isinstance(itself, CheckpointRef):
        found.checkpoints.append(itself)
        return found
    for entry in storage.list(root):
        if not entry.is_dir:
            if entry.name.endswith(SINGLE_FILE_SUFFIXES) and entry.size > 0:
                found.checkpoints.append(
                    CheckpointRef(uri=entry.uri, name=entry.name, step=step_of(entry.name), format="torch-save", mtime=entry.mtime)
                )
            continue
        try:
            kind = inspect_dir(storage, entry.uri, entry.name)
        except PermissionError as exc:
            found.incomplete.append(IncompleteSave(entry.uri, entry.name, step_of(entry.name), f"unreadable: {exc.strerror}"))
            continue
        if isinstance(kind, CheckpointRef):
            found.checkpoints.append(kind)
        elif isinstance(kind, IncompleteSave):
            found.incomplete.append(kind)
    # Oldest first: by step, and by time for files that carry no step in their name.
    found.checkpoints.sort(key=lambda c: (c.step if c.step is not None else -1, c.mtime, c.name))
    found.incomplete.sort(key=lambda c: (c.step if c.step is not None else -1, c.name))
    return found
