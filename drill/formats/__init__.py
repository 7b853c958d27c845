"""The formats drill knows, each a :class:`~drill.formats.base.Format` in a module of its own.

The registry below is the one place that lists them; everything else asks it: which format a
directory or file is (:func:`recognize`, :func:`recognize_file`), what a run's trainers would
resume from (:func:`pointers`), a format's structural proof (:func:`structure`), its restore
(:func:`get`). Order matters where one format's checkpoint holds another's: a Hugging Face
Trainer checkpoint made with DeepSpeed holds a DeepSpeed ``global_stepN/``; an accelerate
FSDP save holds DCP directories — the outer format is asked first.

This module is cheap to import (no torch): formats are loaded on first use.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from drill.checkpoints import CheckpointRef, Discovery, IncompleteSave
    from drill.formats.base import Format, Structure
    from drill.restore import RestoreResult
    from drill.storage import Entry, Storage

_REGISTRY = {
    "hf-trainer": "drill.formats.hf:HFTrainer",
    "lightning-deepspeed": "drill.formats.lightning_deepspeed:LightningDeepSpeed",
    "deepspeed": "drill.formats.deepspeed:DeepSpeed",
    "accelerate": "drill.formats.accelerate:Accelerate",
    "torchsnapshot": "drill.formats.torchsnapshot:TorchSnapshot",
    "torchtune": "drill.formats.torchtune:TorchTune",
    "safetensors": "drill.formats.safetensors_dir:SafetensorsDir",
    "dcp": "drill.formats.dcp:DCP",
    "composer": "drill.formats.composer:Composer",
    "torch-save": "drill.formats.torch_save:TorchSave",
    "lightning": "drill.formats.torch_save:Lightning",
    "unknown": "drill.formats.unknown:UnknownWriter",  # last: what no format above claims
}
FORMATS = ("auto", *_REGISTRY)
"""What ``--format`` and a policy's ``checkpoints.format`` accept."""


def parse_format(name: str) -> str:
    """The format name; raises ``ValueError`` for one drill has no adapter for."""
    text = str(name).strip().lower()
    if text not in FORMATS:
        raise ValueError(f"unknown format {name!r}: expected one of {', '.join(FORMATS)}")
    return text


@functools.cache
def get(name: str) -> Format:
    """The registered format called ``name`` (a detected or forced one)."""
    module, _, cls = _REGISTRY[parse_format(name)].partition(":")
    return getattr(importlib.import_module(module), cls)()


def registered() -> list[Format]:
    """Every format, in the order they are asked."""
    return [get(name) for name in _REGISTRY]


def resolve_format(forced: str, detected: str) -> str:
    """The format a drill uses: the detected one unless ``--format`` forces one. Lightning's
    sharded FSDP checkpoint is a ``.ckpt`` *directory* of DCP shards, so ``lightning`` on a DCP
    directory reads it as DCP (its ``meta.pt`` is read by the Lightning layout)."""
    if forced == "auto" or (forced == "lightning" and detected == "dcp"):
        return detected
    return forced


def recognize(storage: Storage, uri: str, name: str, entries: list[Entry]) -> CheckpointRef | IncompleteSave | None:
    """What the directory ``uri`` is: the first format that recognizes it says (each asks one
    :class:`~drill.storage.Listing` of its entries, indexed once)."""
    from drill.storage import Listing

    listing = Listing.of(entries)
    for fmt in registered():
        found = fmt.recognize(storage, uri, name, listing)
        if found is not None:
            return found
    return None


def recognize_file(entry: Entry) -> CheckpointRef | None:
    for fmt in registered():
        found = fmt.recognize_file(entry)
        if found is not None:
            return found
    return None


def nested(storage: Storage, uri: str, entries: list[Entry], names: Any = None) -> list[tuple[str, Format]]:
    """The checkpoints another format wrote inside the checkpoint at ``uri`` (accelerate's FSDP
    directories, the Trainer's DeepSpeed ``global_stepN/``): (sub-directory, its format), for the
    sub-directories ``names`` admits (a predicate; None: all). They are parts of the one checkpoint."""
    out = []
    for entry in entries:
        if entry.is_dir and (names is None or names(entry.name)):
            found = recognize(storage, entry.uri, entry.name, storage.list(entry.uri))
            if found is not None and not hasattr(found, "reason"):
                out.append((entry.name, get(found.format)))
    return out


def markers() -> str:
    """Every format's commit marker, for a save that has none of them."""
    return ", ".join(m for fmt in registered() if (m := getattr(fmt, "marker", "")))


def pointers(storage: Storage, root: str, entries: dict[str, Entry], found: Discovery) -> list[tuple[str, str]]:
    """(who follows it, the checkpoint it names) for every resume pointer any format's trainer
    would follow in this run root."""
    out: list[tuple[str, str]] = []
    for fmt in registered():
        out += [p for p in fmt.pointers(storage, root, entries, found) if p not in out]
    return out


def structure(
    name: str, storage: Storage, uri: str, sizes: dict[str, int], allow_classes: tuple[str, ...] = ()
) -> Structure | None:
    """The structural proof of the unsealed checkpoint ``uri`` of format ``name``, made without
    loading it; None for a format without one."""
    return get(name).structure(storage, uri, sizes, allow_classes)


def restore(storage: Storage, ref: CheckpointRef, device: Any, **context: Any) -> RestoreResult:
    """Restore ``ref`` with its format (or ``format=``), as a drill does.

    ``context`` fills a :class:`~drill.formats.base.RestoreContext` (``hash_plan``,
    ``allow_classes``, ``progress``, ``memory_budget``).
    """
    from drill.formats.base import RestoreContext

    name = context.pop("format", "auto")
    return get(resolve_format(name, ref.format)).restore(storage, ref, RestoreContext(device=device, **context))


__all__ = [
    "FORMATS",
    "get",
    "markers",
    "nested",
    "parse_format",
    "pointers",
    "recognize",
    "recognize_file",
    "registered",
    "resolve_format",
    "restore",
    "structure",
]
