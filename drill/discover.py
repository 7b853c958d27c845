"""Find the checkpoints a training run has retained under its root.

A *checkpoint* is a complete save; which directories and files are one, and what makes one
complete, is each format's knowledge (:mod:`drill.formats`): this module lists the run and asks
them. A directory that looks like a save (a step in its name) but that no format recognizes as
complete is an *incomplete save*: reported, never selected. Files a trainer leaves at the top
of a run at its end (Hugging Face's ``save_model``/``save_state``) are a *final export*:
weights, not a resumable checkpoint, and reported as such.
"""

from __future__ import annotations

from dataclasses import dataclass

from drill import formats
from drill.checkpoints import CheckpointRef, Discovery, IncompleteSave, step_of
from drill.storage import Entry, EntryKind, Listing, Storage


def inspect_dir(
    storage: Storage, uri: str, name: str, entries: list[Entry] | None = None
) -> CheckpointRef | IncompleteSave | None:
    """Classify one directory: a complete save, an incomplete save, or neither."""
    listed = entries if entries is not None else storage.list(uri)
    found = formats.recognize(storage, uri, name, listed)
    if found is not None:
        return found
    step = step_of(name)
    if step is not None:
        reason = (
            f"no commit marker of any format drill knows ({formats.markers()}): the save never finished"
            if listed
            else "empty directory"
        )
        return IncompleteSave(uri=uri, name=name, step=step, reason=reason)
    return None


def discover(storage: Storage, root: str) -> Discovery:
    """List the complete and incomplete saves directly under ``root`` (or ``root`` itself
    when it is one checkpoint and holds none).

    Raises ``FileNotFoundError``/``NotADirectoryError`` when the root itself is unusable.
    """
    root_entry = storage.stat(root)
    found = Discovery(root=root)
    if not root_entry.is_dir:
        single = formats.recognize_file(root_entry)
        if single is None:
            raise NotADirectoryError(20, "Not a directory", root)
        found.checkpoints.append(single)
        return found
    entries = Listing.of(storage.list(root))  # indexed once, for every format asked below
    claimed = formats.recognize(storage, root, root_entry.name, entries)
    if isinstance(claimed, CheckpointRef) and not formats.get(claimed.format).is_export(claimed, entries):
        # ``drill run --root step-40``: the root is itself one checkpoint — its files and the
        # checkpoints nested in it (accelerate's FSDP directories) are parts of it.
        found.checkpoints.append(claimed)
        return found
    for entry in entries:
        if is_link_pointer(entry):
            continue  # a resume pointer (checks.resume judges it), not a save of its own
        if entry.is_dir:
            _add_dir(storage, entry, found)
        elif entry.kind in (EntryKind.DANGLING, EntryKind.LOOP) and step_of(entry.name) is not None:
            why = "a symlink that leads back into itself" if entry.kind is EntryKind.LOOP else "a symlink to nothing"
            found.incomplete.append(
                IncompleteSave(entry.uri, entry.name, step_of(entry.name), f"{why}: no save behind it")
            )
    if not found.checkpoints and not found.incomplete:
        if isinstance(claimed, IncompleteSave):
            found.incomplete.append(claimed)
            return found  # a format's unfinished save: its files (a common.pt) are part of it, not checkpoints
        itself = inspect_dir(storage, root, root_entry.name, entries)
        if isinstance(itself, IncompleteSave):
            found.incomplete.append(itself)
    found.checkpoints += [c for e in entries if not is_link_pointer(e) and (c := formats.recognize_file(e)) is not None]
    _unfinished_among_known(found)
    found.exports = sorted({name for fmt in formats.registered() for name in fmt.exports(entries)})
    # Oldest first: by step, and by time for files that carry no step in their name.
    found.checkpoints.sort(key=lambda c: (c.step if c.step is not None else -1, c.mtime, c.name))
    found.incomplete.sort(key=lambda c: (c.step if c.step is not None else -1, c.name))
    return found


def is_link_pointer(entry: Entry) -> bool:
    """A symlink at the run's top that is a resume pointer (``latest -> step-8``, Composer's
    ``latest-rank0.pt``): not named by a step — a save stored through a link is a save — and
    not naming itself."""
    target = (entry.link_target or "").rstrip("/").rsplit("/", 1)[-1]
    return bool(target) and target != entry.name and step_of(entry.name) is None


def _unfinished_among_known(found: Discovery) -> None:
    """In a run whose saves a format knows, a step directory only the fallback would claim (a
    lone ``model.safetensors``, no commit marker) is that writer's unfinished save, not a
    checkpoint of some other writer."""
    fallback = [c for c in found.checkpoints if formats.get(c.format).fallback]
    if not fallback or len(fallback) == len(found.checkpoints):
        return
    found.checkpoints = [c for c in found.checkpoints if c not in fallback]
    found.incomplete += [
        IncompleteSave(
            c.uri,
            c.name,
            c.step,
            f"no commit marker of any format drill knows ({formats.markers()}), which the run's other saves have: the save never finished",
        )
        for c in fallback
    ]


def _add_dir(storage: Storage, entry: Entry, found: Discovery) -> None:
    try:
        kind = inspect_dir(storage, entry.uri, entry.name)
    except OSError as exc:  # unreadable, a loop below it, an I/O error: this save, not the run
        found.incomplete.append(
            IncompleteSave(entry.uri, entry.name, step_of(entry.name), f"unreadable: {exc.strerror or exc}")
        )
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
        return PathKind("file", ref=formats.recognize_file(entry))
    found = discover(storage, uri)
    if len(found.checkpoints) == 1 and found.checkpoints[0].uri == uri:
        return PathKind("checkpoint", ref=found.checkpoints[0])
    if found.checkpoints or len(found.incomplete) > 1 or (found.incomplete and found.incomplete[0].uri != uri):
        return PathKind("run-root", discovery=found)
    if found.incomplete:
        return PathKind("incomplete", incomplete=found.incomplete[0])
    return PathKind("directory" if storage.list(uri) else "empty")


__all__ = [
    "CheckpointRef",
    "Discovery",
    "IncompleteSave",
    "PathKind",
    "classify",
    "discover",
    "inspect_dir",
    "is_link_pointer",
    "step_of",
]
