"""The contract every format adapter implements, and the one way adapters read a file.

An adapter turns one checkpoint — whatever wrote it — into a :class:`RestoreResult`: every
file read exactly once through the :class:`~drill.storage.Storage` (hashed as the plan says),
every entry loaded onto the device or recorded as a failure, the state in the canonical view
(``part.key.path``), and the facts the format knows about itself (its
:class:`~drill.formats.canonical.Layout`). Adapters never raise for a damaged checkpoint.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from drill.discover import CheckpointRef
from drill.errors import one_line  # noqa: F401 - where the format adapters import it from
from drill.integrity.hashing import HashPlan
from drill.integrity.reading import describe_read_error, read_whole
from drill.restore import FileRead, NullProgress, Progress, RestoreResult
from drill.storage import Storage

if TYPE_CHECKING:
    import torch


@dataclass(slots=True, kw_only=True)
class RestoreContext:
    """What an adapter needs besides the checkpoint: where to load, what to hash, what to allow."""

    device: torch.device
    progress: Progress = field(default_factory=NullProgress)
    hash_plan: HashPlan = field(default_factory=HashPlan)
    allow_classes: tuple[str, ...] = ()
    """Classes a layout legitimately pickles, allow-listed by the user or policy."""
    memory_budget: int | None = None
    """Bytes the restored state may occupy on the device; a checkpoint claiming more is
    refused with a finding before anything is allocated. None: no limit."""
    shard: Any = None
    """This rank's :class:`~drill.formats.dcp_shard.Shard` when many ranks restore the
    checkpoint together; None: this process restores all of it."""


class FormatAdapter(Protocol):
    name: str
    """The ``--format`` name (``dcp``, ``torch-save``, ``lightning``, ``hf-trainer``)."""

    def restore(self, storage: Storage, ref: CheckpointRef, ctx: RestoreContext) -> RestoreResult:
        """Read and load ``ref``; every problem is recorded in the result, never raised."""
        ...


def read_file(
    storage: Storage, base: str, relative: str, size: int | None, ctx: RestoreContext, result: RestoreResult
) -> memoryview | None:
    """Read one file of the checkpoint into memory, hashed as the plan says, and record it in
    ``result.files``; None (with the error recorded) when it cannot be read. An empty
    ``relative`` reads ``base`` itself (a single-file checkpoint)."""
    record = FileRead(relative or base.rstrip("/").rsplit("/", 1)[-1], size)
    result.files.append(record)
    started = time.perf_counter()
    try:
        uri = storage.child(base, relative) if relative else base
        if record.size is None:
            record.size = storage.stat(uri).size
        got = read_whole(
            storage,
            uri,
            record.size,
            ctx.progress.advance,
            hash=ctx.hash_plan.wants(relative),
            chunk_size=ctx.hash_plan.chunk_size,
            sha256=relative in ctx.hash_plan.sha256,
        )
    except (OSError, EOFError) as exc:
        record.error, record.error_kind = describe_read_error(exc)
        return None
    finally:
        result.read_seconds += time.perf_counter() - started
    record.hashes, record.retries, record.bytes_read = got.hashes, got.retries, len(got.view)
    return got.view


def check_budget(need: int, ctx: RestoreContext) -> None:
    """Refuse, before allocating, a restore that would not fit the device's memory: the one
    budget every format is held to (``need`` is what its index or archive claims)."""
    from drill.errors import ResourceLimit
    from drill.units import human_bytes

    budget = ctx.memory_budget if ctx.memory_budget is not None else available_memory(ctx.device)
    if budget is not None and need > budget:
        raise ResourceLimit(f"restoring this checkpoint needs {human_bytes(need)} on {ctx.device}, which has {human_bytes(budget)} available")


def available_memory(device: torch.device) -> int | None:
    """What the device can still allocate: CUDA's free memory, or the host's MemAvailable."""
    if device.type == "cuda":
        import torch

        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def tally(result: RestoreResult, state: dict[str, Any]) -> None:
    """Count what landed: tensors, their bytes, and plain values."""
    import torch

    tensors = [v for v in state.values() if isinstance(v, torch.Tensor)]
    result.tensors_loaded = len(tensors)
    result.tensor_bytes = sum(t.numel() * t.element_size() for t in tensors)
    result.values_loaded = len(state) - len(tensors)
