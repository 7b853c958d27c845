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

import itertools
from collections.abc import Iterable, Iterator
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


class IndexParts:
    """The index, arranged once so that each rank's part of it costs what that part holds: the
    storage entries by file, each chunk by its tensor and offsets. Cutting N parts is then
    O(index + N × headers) on rank 0, not N passes over the whole index."""

    def __init__(self, metadata: Any) -> None:
        self.metadata = metadata
        self.by_file: dict[str, list[tuple[Any, Any]]] = {}
        for index, info in (metadata.storage_data or {}).items():
            self.by_file.setdefault(info.relative_path, []).append((index, info))
        self.chunk_at: dict[tuple[str, tuple[int, ...]], tuple[int, Any]] = {}
        for fqn, md in metadata.state_dict_metadata.items():
            if is_tensor(md):
                for n, chunk in enumerate(md.chunks):
                    self.chunk_at[(fqn, tuple(chunk.offsets))] = (n, chunk)

    def part(self, files: Iterable[str]) -> Any:
        """The part of the index that describes ``files``: their storage entries, and of each
        tensor stored there its properties and the chunks those files hold — each chunk is in
        one file, so the parts of all ranks add up to one index."""
        from dataclasses import replace

        stored = {index: info for f in files for index, info in self.by_file.get(f, ())}
        held: dict[str, list[tuple[int, ...]]] = {}
        for index in stored:
            held.setdefault(index.fqn, []).append(tuple(index.offset or ()))
        described = {}
        for fqn, offsets in held.items():
            md = self.metadata.state_dict_metadata.get(fqn)
            if md is not None and is_tensor(md):
                found = sorted(self.chunk_at[(fqn, o)] for o in set(offsets) if (fqn, o) in self.chunk_at)
                md = replace(md, chunks=[chunk for _, chunk in found])
            if md is not None:
                described[fqn] = md
        return replace(self.metadata, state_dict_metadata=described, storage_data=stored, planner_data=None)


def index_for(metadata: Any, files: set[str]) -> Any:
    """The part of the index that describes ``files`` (see :class:`IndexParts`)."""
    return IndexParts(metadata).part(files)


def plans(plan: tuple[Any, ...], world: int) -> Iterator[tuple[Any, ...]]:
    """Each rank's plan from rank 0's — (status, its part of the index, {rank: its files}) —
    rank 0's holding the whole index and every rank's files; made one at a time, as each is
    sent (rank 0 never holds every rank's part at once)."""
    status, metadata, assignment = plan
    if status != "ok":
        yield from itertools.repeat(plan, world)
        return
    yield ("ok", metadata, dict(enumerate(assignment)))
    parts = IndexParts(metadata)
    for r in range(1, world):
        yield ("ok", parts.part(assignment[r]), {r: assignment[r]})


def restore_shard(storage: Storage, ref: CheckpointRef, ctx: RestoreContext, shard: Shard) -> RestoreResult:
    result = RestoreResult(uri=ref.uri, format="dcp", device=str(ctx.device), index_file=DCP_METADATA)
    result.layout = Layout(format="dcp", required=parts.CANONICAL_PARTS, optimizer_keys="fqn")
    if ref.step is not None:
        result.layout.step_counters["directory name"] = ref.step
    reader = DrillReader(storage, ref.uri, result, ctx)
    plan = receive_plan(storage, ref, reader, shard)
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


def receive_plan(storage: Storage, ref: CheckpointRef, reader: DrillReader, shard: Shard) -> tuple[Any, ...]:
    """This rank's plan: rank 0 makes every rank's and sends each its own."""
    if shard.rank != 0:
        return shard.scatter(None)
    return shard.scatter(plans(_plan_on_root(storage, ref, reader, shard.world), shard.world))


def _item_bytes(metadata: Any, item: ReadItem) -> int:
    md = metadata.state_dict_metadata[item.dest_index.fqn]
    return chunk_bytes(md, item.lengths) if is_tensor(md) else 0


__all__ = ["ChunkPlanner", "IndexParts", "Shard", "index_for", "plans", "receive_plan", "restore_shard", "shard_items"]
