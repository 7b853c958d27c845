"""One rank's share of a DCP checkpoint restored by many ranks at once.

Rank 0 reads ``.metadata`` (once, hashed), checks that the index is plausible and assigns the
data files to ranks balanced by bytes; every rank gets the index and the assignment from it.
Each rank then reads its own files through :class:`~drill.formats.dcp.DrillReader` — every
byte read and hashed exactly once across the job — and loads each chunk stored there into a
tensor of the chunk's own shape: a checkpoint saved by N ranks restores on any number of
drill ranks (resharded by file), and no rank allocates more than its share.
"""

from __future__ import annotations

from typing import Any

import torch

from drill import parts
from drill.checkpoints import CheckpointRef
from drill.formats.base import RestoreContext, check_budget
from drill.formats.canonical import Layout
from drill.formats.dcp_index import claimed_bytes, file_sizes, inventory, saved_ranks
from drill.formats.dcp_names import DCP_METADATA
from drill.formats.dcp_read import DrillReader, MetadataUnreadable, TargetPlanner
from drill.formats.dcp_types import ReadItem, chunk_bytes, is_tensor, read_items
from drill.restore import ItemFailure, RestoreResult
from drill.restore.partition import Shard, assign
from drill.storage import Storage


class ChunkPlanner(TargetPlanner):
    """Targets shaped like the stored chunks, allocated as the reader reaches them."""

    def __init__(self, failures: list[ItemFailure], metadata: Any, device: torch.device) -> None:
        super().__init__({}, failures)
        self.metadata = metadata
        self.device = device
        self.chunks: dict[tuple[str, tuple[int, ...]], torch.Tensor] = {}

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        key = (read_item.dest_index.fqn, tuple(read_item.dest_index.offset or ()))
        target = self.chunks.get(key)
        if target is None:
            md = self.metadata.state_dict_metadata[key[0]]
            target = self.chunks[key] = torch.empty(
                tuple(read_item.lengths), dtype=md.properties.dtype, device=self.device
            )
        return target

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        pass  # read in place


def shard_items(metadata: Any, files: set[str]) -> list[ReadItem]:
    """A read item per chunk or value stored in ``files``: each read whole into its own target."""
    return read_items(metadata, files)


def _plan_on_root(storage: Storage, ref: CheckpointRef, reader: DrillReader, world: int) -> tuple[Any, ...]:
    """Rank 0: read the index once and assign the files; what every rank then receives."""
    try:
        metadata = reader.read_metadata()
    except MetadataUnreadable as exc:
        return ("unreadable", str(exc), None)
    sizes = file_sizes(storage, ref.uri, metadata)
    try:
        claimed_bytes(metadata, sizes)
    except ValueError as exc:
        return ("implausible", f".metadata: {exc}", None)
    named = {info.relative_path for info in (metadata.storage_data or {}).values()}
    # A file the index names but storage lacks is assigned too: its rank reports it missing.
    return ("ok", metadata, assign({p: sizes.get(p, 0) for p in named}, world))


def restore_shard(storage: Storage, ref: CheckpointRef, ctx: RestoreContext, shard: Shard) -> RestoreResult:
    result = RestoreResult(uri=ref.uri, format="dcp", device=str(ctx.device), index_file=DCP_METADATA)
    result.layout = Layout(format="dcp", required=parts.CANONICAL_PARTS, optimizer_keys="fqn")
    if ref.step is not None:
        result.layout.step_counters["directory name"] = ref.step
    reader = DrillReader(storage, ref.uri, result, ctx)
    plan = shard.broadcast(_plan_on_root(storage, ref, reader, shard.world) if shard.rank == 0 else None)
    if plan[0] != "ok":
        result.metadata_error = plan[1]
        result.metadata_code = "metadata-implausible" if plan[0] == "implausible" else None
        return result
    metadata, shard.assignment = plan[1], plan[2]
    reader._metadata = metadata
    result.index, result.inventory = metadata.storage_data, inventory(metadata)
    result.layout.saved_ranks = saved_ranks(metadata)
    result.layout.notes.append(f"saved by {len(result.layout.saved_ranks) or 1} rank(s); restored by {shard.world}")
    mine = set(shard.assignment[shard.rank])
    items = shard_items(metadata, mine)
    check_budget(sum(_item_bytes(metadata, i) for i in items), ctx)
    ctx.progress.phase("read", total_bytes=sum(file_sizes(storage, ref.uri, metadata).get(p, 0) for p in mine))
    planner = ChunkPlanner(result.failures, metadata, ctx.device)
    reader.set_up_storage_reader(metadata, shard.rank == 0)
    reader.read_items(items, planner)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    result.values_loaded = planner.values_loaded
    result.state = dict(planner.state_dict)
    for (fqn, offsets), tensor in planner.chunks.items():
        md = metadata.state_dict_metadata[fqn]
        if tuple(tensor.shape) == tuple(md.size):
            result.state[fqn] = tensor
        else:
            result.chunks.append((fqn, offsets, tensor))
    return result


def _item_bytes(metadata: Any, item: ReadItem) -> int:
    md = metadata.state_dict_metadata[item.dest_index.fqn]
    return chunk_bytes(md, item.lengths) if is_tensor(md) else 0


__all__ = ["ChunkPlanner", "Shard", "restore_shard", "shard_items"]
