"""Find the checkpoints a training run has retained under its root.

A *checkpoint* is a complete save. A directory that looks like a save but lacks its commit
marker (DCP writes ``.metadata`` last) is an *incomplete save*: reported, never selected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from drill.storage import Storage

DCP_METADATA = ".metadata"

# torchtitan writes step-N; other trainers use checkpoint-N, iter_N, global_stepN.
_STEP_DIR = re.compile(r"^(?:step|checkpoint|iter|global_step)[-_]?(\d+)$")


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
    return int(m.group(1)) if m else None


def looks_like_checkpoint_name(name: str) -> bool:
    return _STEP_DIR.match(name) is not None


def inspect_dir(storage: Storage, uri: str, name: str) -> CheckpointRef | IncompleteSave | None:
    """Classify one directory: a complete DCP save, an incomplete save, or neither."""
    step = step_of(name)
    names = {e.name: e for e in storage.list(uri)}
    if DCP_METADATA in names and not names[DCP_METADATA].is_dir:
        return CheckpointRef(uri=uri, name=name, step=step, format="dcp", mtime=names[DCP_METADATA].mtime)
    if step is not None:
        reason = "no .metadata: the save never finished" if names else "empty directory"
        return IncompleteSave(uri=uri, name=name, step=step, reason=reason)
    return None


def discover(storage: Storage, root: str) -> Discovery:
    """List the complete and incomplete saves directly under ``root``.

    Raises ``FileNotFoundError``/``NotADirectoryError`` when the root itself is unusable.
    """
    root_entry = storage.stat(root)
    if not root_entry.is_dir:
        raise NotADirectoryError(20, "Not a directory", root)
    found = Discovery(root=root)
    # The root may itself be one checkpoint (``drill run --root step-40``).
    itself = inspect_dir(storage, root, root_entry.name)
    if isinstance(itself, CheckpointRef):
        found.checkpoints.append(itself)
        return found
    for entry in storage.list(root):
        if not entry.is_dir:
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
    order = lambda c: (c.step if c.step is not None else -1, c.name)  # noqa: E731
    found.checkpoints.sort(key=order)
    found.incomplete.sort(key=order)
    return found
