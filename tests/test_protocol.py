"""The distributed restore's protocol: what leaves rank 0 grows with the index and the ranks'
plans, not with ranks × index (drill/formats/dcp_shard.py: ``plans``, ``index_for``)."""

from __future__ import annotations

import pickle

import torch

from drill.formats.dcp_shard import index_for, plans
from drill.formats.dcp_types import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
    _StorageInfo,
    read_items,
)
from drill.restore.partition import assign


def _sharded_index(tensors: int, shards: int) -> Metadata:
    """A save of ``tensors`` tensors, each split row-wise over ``shards`` writer ranks (FSDP's
    way): ``tensors × shards`` chunks in ``shards`` files."""
    sdm, data = {}, {}
    for t in range(tensors):
        fqn = f"model.layers.{t}.weight"
        chunks = [ChunkStorageMetadata(torch.Size([r * 4, 0]), torch.Size([4, 16])) for r in range(shards)]
        sdm[fqn] = TensorStorageMetadata(TensorProperties(torch.float32), torch.Size([4 * shards, 16]), chunks)
        for r, c in enumerate(chunks):
            data[MetadataIndex(fqn, c.offsets, r)] = _StorageInfo(f"__{r}_0.distcp", t * 256, 256)
    return Metadata(state_dict_metadata=sdm, storage_data=data)


def test_what_leaves_rank_0_is_one_index_whatever_the_ranks() -> None:
    """2,000 tensors over 64 writer files (128,000 chunks), restored by 8, 32 and 64 ranks:
    every rank but 0 gets only its own plan, and all of them together weigh about one index —
    where the whole index to each rank was ranks × index."""
    from dataclasses import replace

    metadata = _sharded_index(2_000, 64)
    index_bytes = len(pickle.dumps(metadata))
    # What a plan repeats per rank: the properties and shape of each tensor it holds a chunk of
    # (FSDP puts a chunk of every tensor in every file), without the chunks — the N × plan term.
    headers = len(pickle.dumps({f: replace(md, chunks=[]) for f, md in metadata.state_dict_metadata.items()}))
    sizes = {f"__{r}_0.distcp": 512_000 for r in range(64)}
    for world in (8, 32, 64):
        sent = plans(("ok", metadata, assign(sizes, world)), world)[1:]  # what rank 0 writes for the others
        out = sum(len(pickle.dumps(p)) for p in sent)
        assert out <= 1.05 * index_bytes + (world - 1) * headers, (world, out, index_bytes, headers)
        assert out < 0.2 * (world - 1) * index_bytes  # what the whole index to every rank cost
        assert max(len(pickle.dumps(p)) for p in sent) <= 1.5 * index_bytes / world + headers


def test_a_ranks_part_of_the_index_reads_exactly_its_files() -> None:
    metadata = _sharded_index(50, 8)
    assignment = assign({f"__{r}_0.distcp": 1 for r in range(8)}, 3)
    seen = []
    for files in assignment:
        part = index_for(metadata, set(files))
        items = read_items(part, set(files))
        assert [(i.dest_index.fqn, tuple(i.dest_offsets)) for i in items] == [
            (i.dest_index.fqn, tuple(i.dest_offsets)) for i in read_items(metadata, set(files))
        ]
        assert all(
            part.state_dict_metadata[i.dest_index.fqn].size == metadata.state_dict_metadata[i.dest_index.fqn].size
            for i in items
        )
        seen += items
    assert len(seen) == len(read_items(metadata)) == 50 * 8  # every chunk read once across the ranks


def test_files_go_to_ranks_by_bytes_at_scale() -> None:
    """130,000 files onto 16,384 ranks (the heap: seconds, not files × ranks); balanced within 4/3."""
    sizes = {f"__{r}_{n}.distcp": 1 + (r * 7919 + n) % 1000 for r in range(13_000) for n in range(10)}
    assignment = assign(sizes, 16_384)
    assert sorted(p for files in assignment for p in files) == sorted(sizes)
    loads = [sum(sizes[p] for p in files) for files in assignment]
    assert max(loads) <= 4 / 3 * (sum(loads) / len(loads)) + max(sizes.values())
