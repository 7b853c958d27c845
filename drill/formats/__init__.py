"""Format adapters: each restores one kind of checkpoint into the canonical view.

=============  =====================================================================
``dcp``        PyTorch Distributed Checkpoint directories (torchtitan ``step-N/``,
               the demo run, anything ``dcp.save`` wrote)
``torch-save`` single-file ``torch.save`` checkpoints (nanoGPT-style dicts)
``lightning``  Lightning ``.ckpt`` files (a ``torch.save`` with Lightning's layout)
``hf-trainer`` Hugging Face Trainer ``checkpoint-N/`` directories
=============  =====================================================================

Every adapter implements :class:`~drill.formats.base.FormatAdapter`. This module is cheap to
import (no torch): the registry names where each adapter lives and loads it on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

    from drill.discover import CheckpointRef
    from drill.findings import Finding
    from drill.formats.base import FormatAdapter
    from drill.restore import RestoreResult
    from drill.storage import Storage

_REGISTRY = {
    "dcp": "drill.formats.dcp:DCPAdapter",
    "torch-save": "drill.formats.torch_save:TorchSaveAdapter",
    "lightning": "drill.formats.torch_save:LightningAdapter",
    "hf-trainer": "drill.formats.hf:HFTrainerAdapter",
}
_STRUCTURE = {
    "dcp": "drill.formats.dcp_layout:structure",
    "hf-trainer": "drill.formats.hf:structure",
}
"""Each format's structural proof of an unsealed checkpoint, made without loading it: the one
``drill verify`` gives, and ``drill run`` agrees with."""
FORMATS = ("auto", *_REGISTRY)
"""What ``--format`` and a policy's ``checkpoints.format`` accept."""


def parse_format(name: str) -> str:
    """The format name; raises ``ValueError`` for one drill has no adapter for."""
    text = str(name).strip().lower()
    if text not in FORMATS:
        raise ValueError(f"unknown format {name!r}: expected one of {', '.join(FORMATS)}")
    return text


def resolve_format(forced: str, detected: str) -> str:
    """The adapter a drill uses: the detected format unless ``--format`` forces one. Lightning's
    sharded FSDP checkpoint is a ``.ckpt`` *directory* of DCP shards, so ``lightning`` on a DCP
    directory reads it as DCP (its ``meta.pt`` is read by the Lightning layout)."""
    if forced == "auto" or (forced == "lightning" and detected == "dcp"):
        return detected
    return forced


def adapter_for(name: str) -> FormatAdapter:
    """The adapter registered for ``name`` (a detected or forced format)."""
    module, _, cls = _REGISTRY[parse_format(name)].partition(":")
    return getattr(importlib.import_module(module), cls)()


def structure(name: str, storage: Storage, uri: str, sizes: Mapping[str, int], allow_classes: tuple[str, ...] = ()) -> tuple[list[Finding], dict[str, Any]] | None:
    """The structural proof of the unsealed checkpoint ``uri`` of format ``name`` (``sizes``:
    its files as listed); None for a format without one."""
    where = _STRUCTURE.get(name)
    if where is None:
        return None
    module, _, fn = where.partition(":")
    return getattr(importlib.import_module(module), fn)(storage, uri, sizes, allow_classes)


def restore(storage: Storage, ref: CheckpointRef, device: Any, **context: Any) -> RestoreResult:
    """Restore ``ref`` with the adapter for its format (or ``format=``), as a drill does.

    ``context`` fills a :class:`~drill.formats.base.RestoreContext` (``hash_plan``,
    ``allow_classes``, ``progress``, ``memory_budget``).
    """
    from drill.formats.base import RestoreContext

    name = context.pop("format", "auto")
    adapter = adapter_for(resolve_format(name, ref.format))
    return adapter.restore(storage, ref, RestoreContext(device=device, **context))


__all__ = ["FORMATS", "adapter_for", "parse_format", "resolve_format", "restore", "structure"]
