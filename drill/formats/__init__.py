"""Format adapters: each restores one kind of checkpoint into the canonical view.

=============  =====================================================================
``dcp``        PyTorch Distributed Checkpoint directories (torchtitan ``step-N/``,
               the demo run, anything ``dcp.save`` wrote)
``torch-save`` single-file ``torch.save`` checkpoints (nanoGPT-style dicts)
``lightning``  Lightning ``.ckpt`` files (a ``torch.save`` with Lightning's layout)
``hf-trainer`` Hugging Face Trainer ``checkpoint-N/`` directories
=============  =====================================================================
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from drill import parts
from drill.discover import CheckpointRef
from drill.errors import UsageError
from drill.formats.canonical import Layout
from drill.restore.progress import Progress
from drill.restore.result import HashPlan, RestoreResult
from drill.storage import Storage

FORMATS = ("auto", "dcp", "torch-save", "lightning", "hf-trainer")


def check_format(name: str) -> str:
    if name not in FORMATS:
        raise UsageError(f"unknown --format {name!r}: expected one of {', '.join(FORMATS)}")
    return name


def restore(
    storage: Storage,
    ref: CheckpointRef,
    device: torch.device,
    progress: Progress,
    plan: HashPlan,
    allow: Iterable[str] = (),
    format: str = "auto",
) -> RestoreResult:
    """Restore ``ref`` with the adapter for its (detected or forced) format."""
    kind = ref.format if format == "auto" else format
    if kind == "dcp":
        from drill.restore.dcp import restore_dcp

        result = restore_dcp(storage, ref, device, progress, plan)
        if result.layout is None:
            result.layout = Layout(format="dcp", required=parts.CANONICAL_PARTS, optimizer_keys="fqn")
            if ref.step is not None:
                result.layout.step_counters["directory name"] = ref.step
        return result
    if kind in ("torch-save", "lightning"):
        from drill.formats.torch_save import restore_torch_save

        return restore_torch_save(storage, ref, device, progress, plan, allow)
    if kind == "hf-trainer":
        from drill.formats.hf import restore_hf

        return restore_hf(storage, ref, device, progress, plan, allow)
    raise UsageError(f"no adapter for format {kind!r}")
