"""The distributed restore's protocol: what leaves rank 0 grows with the index and the ranks'
plans, not with ranks × index (drill/formats/dcp_shard.py: ``plans``, ``index_for``)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
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
        sent = list(plans(("ok", metadata, assign(sizes, world)), world))[1:]  # what rank 0 writes for the others
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


def _write_synthetic_dcp(ckpt: Path, tensors: int, files: int) -> int:
    """A DCP checkpoint whose ``.metadata`` (written with DCP's own classes) indexes ``tensors ×
    files`` chunks — each tensor split row-wise over ``files`` writer files, FSDP's way — over
    sparse data files of the sizes the index claims. Returns the index's size in bytes."""
    import torch.distributed.checkpoint.metadata as m
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    ckpt.mkdir()
    sdm, data = {}, {}
    props = m.TensorProperties(dtype=torch.float32)
    for t in range(tensors):
        fqn = f"model.layers.{t}.weight"
        chunks = [m.ChunkStorageMetadata(torch.Size([r * 4, 0]), torch.Size([4, 16])) for r in range(files)]
        sdm[fqn] = m.TensorStorageMetadata(props, torch.Size([4 * files, 16]), chunks)
        for r, c in enumerate(chunks):
            data[m.MetadataIndex(fqn, c.offsets, r)] = _StorageInfo(f"__{r}_0.distcp", t * 256, 256)
    blob = pickle.dumps(m.Metadata(state_dict_metadata=sdm, storage_data=data))
    (ckpt / ".metadata").write_bytes(blob)
    for r in range(files):
        with open(ckpt / f"__{r}_0.distcp", "wb") as f:
            f.truncate(tensors * 256)
    return len(blob)


@pytest.mark.slow
def test_32_real_ranks_take_their_plans_from_a_million_chunk_index(tmp_path: Path) -> None:
    """The protocol on 32 real processes meeting in a TCPStore this test hosts (as torchrun's
    agent hosts it): a ``.metadata`` of 1,048,576 chunks (16,384 tensors over 64 files). Rank 0
    reads it once and sends each rank its part: what leaves rank 0 is about one index plus a
    header per rank — not 31 indexes — and no other rank's memory grows with the index."""
    import json
    import os
    import socket
    import subprocess
    import sys
    from datetime import timedelta

    import torch.distributed as dist

    world, ckpt, out = 32, tmp_path / "step-1", tmp_path / "figures.json"
    index_bytes = _write_synthetic_dcp(ckpt, 16_384, 64)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, None, is_master=True, timeout=timedelta(seconds=900),
                          wait_for_workers=False, master_listen_fd=listener.fileno())  # fmt: skip
    env = {**os.environ, "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "TORCHELASTIC_USE_AGENT_STORE": "true", "TORCHELASTIC_RUN_ID": "protocol", "OMP_NUM_THREADS": "1"}  # fmt: skip
    ranks = [
        subprocess.Popen([sys.executable, "-m", "tests.support.protocol_rank", str(ckpt), str(out)],
                         env={**env, "RANK": str(r)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(world)
    ]  # fmt: skip
    for p in ranks:
        _, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-3000:]
    del store
    figures = {f["rank"]: f for f in json.loads(out.read_text())}
    root, others = figures[0], [figures[r] for r in range(1, world)]
    assert root["entries"] == 16_384 * 64 and sum(f["entries"] for f in others) < 16_384 * 64
    # Measured here: 144.5 MB of index; rank 0 sent 170.7 MB in all (1.18 indexes: the parts, and
    # in each the properties of the tensors it holds a chunk of) where the whole index to each
    # rank was 31 indexes, 4.5 GB; each plan 5.5 MB; other ranks grew by 100 MB, rank 0 by 2.7 GB.
    assert root["sent_bytes"] < 1.3 * index_bytes, (root["sent_bytes"], index_bytes)
    grew = {r: f["peak_rss"] - f["baseline_rss"] for r, f in figures.items()}
    assert grew[0] < 25 * index_bytes, grew[0]  # the index, once, and one part at a time
    for f in others:
        assert f["plan_bytes"] <= 1.5 * index_bytes / world + 16_384 * 100, f
        assert grew[f["rank"]] < 0.25 * grew[0], (f, grew[0])  # its plan, never the index
