"""One rank's share of a DCP checkpoint restored by many ranks at once.

Rank 0 reads ``.metadata`` (once, hashed), checks that the index is plausible and assigns the
data files to ranks balanced by bytes; every rank gets from it its own plan — its files and the
part of the index that describes them (:func:`index_for`), not the whole index: what leaves
rank 0 is about one index in all, however many ranks there are (the whole index to each of
16,384 ranks would be 16,384 indexes).
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
    """Rank 0: read the index once and assign the files: (status, the index, the assignment)."""
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


def index_for(metadata: Any, files: set[str]) -> Any:
    """The part of the index that describes ``files``: their storage entries, and of each
    tensor stored there its properties and the chunks those files hold — each chunk is in one
    file, so the parts of all ranks add up to one index."""
    from dataclasses import replace

    stored = {index: info for index, info in (metadata.storage_data or {}).items() if info.relative_path in files}
    held: dict[str, set[tuple[int, ...]]] = {}
    for index in stored:
        held.setdefault(index.fqn, set()).add(tuple(index.offset or ()))
    described = {}
    for fqn, offsets in held.items():
        md = metadata.state_dict_metadata.get(fqn)
        if md is not None and is_tensor(md):
            md = replace(md, chunks=[c for c in md.chunks if tuple(c.offsets) in offsets])
        if md is not None:
            described[fqn] = md
    return replace(metadata, state_dict_metadata=described, storage_data=stored, planner_data=None)


def plans(plan: tuple[Any, ...], world: int) -> list[tuple[Any, ...]]:
    """Each rank's plan from rank 0's — (status, its part of the index, {rank: its files}) —
    rank 0's holding the whole index and every rank's files."""
    status, metadata, assignment = plan
    if status != "ok":
        return [plan] * world
    return [("ok", metadata, dict(enumerate(assignment)))] + [
        ("ok", index_for(metadata, set(assignment[r])), {r: assignment[r]}) for r in range(1, world)
    ]


def restore_shard(storage: Storage, ref: CheckpointRef, ctx: RestoreContext, shard: Shard) -> RestoreResult:
    result = RestoreResult(uri=ref.uri, format="dcp", device=str(ctx.device), index_file=DCP_METADATA)
    result.layout = Layout(format="dcp", required=parts.CANONICAL_PARTS, optimizer_keys="fqn")
    if ref.step is not None:
        result.layout.step_counters["directory name"] = ref.step
    reader = DrillReader(storage, ref.uri, result, ctx)
    plan = _receive(storage, ref, reader, shard)
    if plan[0] != "ok":
        result.metadata_error = plan[1]
        result.metadata_code = "metadata-implausible" if plan[0] == "implausible" else None
        return result
    metadata, files = plan[1], plan[2]
    mine = set(files[shard.rank])
    if shard.rank == 0:
        shard.assignment = [files[r] for r in range(shard.world)]  # rank 0 records every rank's files
    reader._metadata = metadata
    result.index, result.inventory = metadata.storage_data, inventory(metadata)
    result.layout.saved_ranks = saved_ranks(metadata)
    result.layout.notes.append(f"saved by {len(result.layout.saved_ranks) or 1} rank(s); restored by {shard.world}")
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


def _receive(storage: Storage, ref: CheckpointRef, reader: DrillReader, shard: Shard) -> tuple[Any, ...]:
    """This rank's plan: rank 0 makes every rank's and sends each its own."""
    if shard.rank != 0:
        return shard.scatter(None)
    return shard.scatter(plans(_plan_on_root(storage, ref, reader, shard.world), shard.world))


def _item_bytes(metadata: Any, item: ReadItem) -> int:
    md = metadata.state_dict_metadata[item.dest_index.fqn]
    return chunk_bytes(md, item.lengths) if is_tensor(md) else 0


__all__ = ["ChunkPlanner", "Shard", "index_for", "plans", "restore_shard", "shard_items"]
