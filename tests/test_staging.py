"""Targets the reader cannot write itself — a GPU's, or a tensor that is not contiguous — are
filled through a bounded ring of host buffers: the same bytes, hashes and CRC-32s as a direct
read, no intermediate tensor per entry, host memory bounded whatever the entry's size."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

import drill.sdk
from drill.integrity.hashing import ChunkHasher
from drill.integrity.manifest import seal_files as seal
from drill.integrity.reading import SequentialReader, hash_stream
from drill.restore.staging import Stager, Stagers, byte_view, flat_bytes
from drill.storage import LocalStorage

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _targets() -> list[torch.Tensor]:
    return [
        torch.empty(300, 257),  # contiguous
        torch.empty(257, 300).t(),  # transposed: not contiguous
        torch.empty(300, 514)[:, ::2],  # strided
        torch.empty(300 * 257, dtype=torch.bfloat16).view(300, 257),  # a dtype numpy lacks
    ]


@pytest.mark.parametrize("target", _targets(), ids=["contiguous", "transposed", "strided", "bfloat16"])
def test_the_ring_fills_a_target_piece_by_piece(tmp_path: Path, target: torch.Tensor) -> None:
    nbytes = target.numel() * target.element_size()
    data = os.urandom(nbytes)
    (tmp_path / "blob").write_bytes(data)
    stager = Stager(torch.device("cpu"), piece=4096, depth=3)
    with open(tmp_path / "blob", "rb", buffering=0) as f:
        reader = SequentialReader(f, nbytes, ChunkHasher(chunk_size=8192))
        crc = stager.copy(reader, target, crc=True)
        hashes = reader.finish()
    stager.finish()
    assert bytes(byte_view(target.contiguous())) == data  # random bytes hold NaNs: compare bytes, not values
    assert crc == zlib.crc32(data)
    assert (
        hashes is not None
        and hashes.chunks == hash_stream(LocalStorage(), str(tmp_path / "blob"), chunk_size=8192).chunks
    )
    assert len(stager._buffers) == 3  # host memory: depth × piece, whatever the tensor's size


def test_a_short_file_is_an_error_not_a_partial_tensor(tmp_path: Path) -> None:
    (tmp_path / "blob").write_bytes(b"\x01" * 10_000)
    target = torch.empty(257, 300).t()
    with open(tmp_path / "blob", "rb", buffering=0) as f:
        reader = SequentialReader(f, 10_000, None)
        with pytest.raises(EOFError, match="shrank"):
            Stager(torch.device("cpu"), piece=4096).copy(reader, target)


def test_only_contiguous_tensors_have_a_byte_view() -> None:
    contiguous, transposed = torch.zeros(4, 3), torch.zeros(3, 4).t()
    flat = flat_bytes(contiguous)
    assert flat is not None and flat.numel() == 48 and flat.data_ptr() == contiguous.data_ptr()
    assert flat_bytes(transposed) is None
    assert Stagers()(torch.device("cpu")) is not None


def _sealed_checkpoint(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    saved = {"w": torch.randn(700, 513), "v": torch.randn(2048, 300).to(torch.bfloat16), "step": torch.tensor(7)}
    ckpt = tmp_path / "step-7"
    dcp.save(saved, checkpoint_id=str(ckpt), no_dist=True)
    seal(ckpt)
    return ckpt, saved


def test_a_resume_into_targets_that_are_not_contiguous(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trainer's tensors may be views (a transposed weight): the verified load fills them
    through the ring, not by deserializing each entry into a tensor of its own."""
    ckpt, saved = _sealed_checkpoint(tmp_path)
    staged: list[tuple[int, ...]] = []
    copy = Stager.copy
    monkeypatch.setattr(
        Stager,
        "copy",
        lambda self, source, target, crc=False: staged.append(tuple(target.shape)) or copy(self, source, target, crc),
    )
    state = {
        "w": torch.empty(513, 700).t(),
        "v": torch.empty(300, 2048, dtype=torch.bfloat16).t(),
        "step": torch.tensor(0),
    }
    report = drill.sdk.load(state, str(ckpt), record=False)
    assert sorted(staged) == [(700, 513), (2048, 300)]
    assert report.sealed and report.verified_files >= 2
    for key, value in saved.items():
        assert torch.equal(state[key], value), key
    assert not state["w"].is_contiguous()  # filled where it lies, not replaced


def test_a_damaged_entry_through_the_ring_names_its_file(tmp_path: Path) -> None:
    ckpt, _ = _sealed_checkpoint(tmp_path)
    shard = next(ckpt.glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x20
    shard.write_bytes(bytes(data))
    state = {
        "w": torch.empty(513, 700).t(),
        "v": torch.empty(300, 2048, dtype=torch.bfloat16).t(),
        "step": torch.tensor(0),
    }
    with pytest.raises(drill.sdk.CheckpointCorrupt, match=shard.name):
        drill.sdk.load(state, str(ckpt), record=False)


@CUDA
def test_a_resume_onto_the_gpu_lands_every_byte(tmp_path: Path) -> None:
    ckpt, saved = _sealed_checkpoint(tmp_path)
    device = torch.device("cuda")
    state = {
        "w": torch.empty(700, 513, device=device),
        "v": torch.empty(300, 2048, dtype=torch.bfloat16, device=device).t(),
        "step": torch.tensor(0),
    }
    drill.sdk.load(state, str(ckpt), record=False)
    for key, value in saved.items():
        assert torch.equal(state[key].cpu(), value), key


@CUDA
def test_the_gpu_ring_is_pinned_and_bounded(tmp_path: Path) -> None:
    nbytes = 5 * 4096 + 100
    data = os.urandom(nbytes)
    (tmp_path / "blob").write_bytes(data)
    stager = Stager(torch.device("cuda"), piece=4096, depth=2)
    target = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    with open(tmp_path / "blob", "rb", buffering=0) as f:
        crc = stager.copy(SequentialReader(f, nbytes, None), target, crc=True)
    stager.finish()
    assert crc == zlib.crc32(data) and bytes(target.cpu().numpy()) == data
    assert len(stager._buffers) == 2 and all(b.is_pinned() for b in stager._buffers)
