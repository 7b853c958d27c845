"""Integrity: every fault on a real sealed checkpoint turns the drill red with its finding."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path
from typing import BinaryIO

import pytest
import torch
import torch.distributed.checkpoint as dcp

from drill import DrillOutcome
from drill.errors import ExitCode
from drill.findings import CheckResult, CheckStatus
from drill.integrity.hashing import DEFAULT_CHUNK_SIZE
from drill.integrity.manifest import MANIFEST_NAME, ManifestInvalid, SealConflict, parse_manifest, read_manifest
from drill.integrity.manifest import seal_files as seal
from drill.safe_pickle import restricted_loads
from drill.storage import LocalStorage
from drill.verifier import verify_checkpoint
from tests.conftest import drill


def _drill(run: Path, db: str, storage=None, **kw) -> DrillOutcome:
    return drill(run, db, storage=storage, **kw)  # the replay is off: these tests are about the bytes


def _integrity(outcome: DrillOutcome):
    return next(c for c in outcome.checks if c.name == "integrity")


def _codes(outcome: DrillOutcome, check: str = "integrity") -> list[tuple[str, str | None]]:
    return [(f.code, f.subject) for c in outcome.checks if c.name == check for f in c.findings]


def test_demo_checkpoints_are_sealed(pristine_run: Path) -> None:
    for step in (10, 20, 30):
        manifest, _ = read_manifest(LocalStorage(), str(pristine_run / f"step-{step}"))
        assert manifest is not None and manifest.step == step
        assert {f.path for f in manifest.files} == {".metadata", "__0_0.distcp", "__0_1.distcp"}
        assert manifest.frameworks["torch"] == torch.__version__


def test_clean_sealed_checkpoint_proves_every_byte(demo_run: Path, sqlite_url: str) -> None:
    outcome = _drill(demo_run, sqlite_url)
    assert outcome.status == "passed"
    integrity = _integrity(outcome)
    assert integrity.summary.startswith("sealed, unauthenticated: every byte matches the manifest (3 files")
    assert integrity.evidence["evidence_level"] == "sealed"
    assert integrity.evidence["bytes_verified"] == integrity.evidence["bytes_listed"]
    assert integrity.evidence["coverage"] == {"days": 7.0, "percent": 100.0}


def test_flipped_bit_is_located_to_its_byte_range(demo_run: Path, sqlite_url: str) -> None:
    shard = demo_run / "step-30" / "__0_1.distcp"
    data = bytearray(shard.read_bytes())
    middle = len(data) // 2
    data[middle] ^= 0x10
    shard.write_bytes(data)
    outcome = _drill(demo_run, sqlite_url)
    assert outcome.status == "failed"
    (finding,) = _integrity(outcome).findings
    assert (finding.code, finding.subject) == ("digest-mismatch", "__0_1.distcp")
    chunk = middle // DEFAULT_CHUNK_SIZE * DEFAULT_CHUNK_SIZE
    assert f"bytes {chunk}..{min(chunk + DEFAULT_CHUNK_SIZE, len(data))}" in finding.message


def test_flipped_bit_range_with_small_chunks(demo_run: Path) -> None:
    ckpt = demo_run / "step-20"
    seal(ckpt, chunk_size=4096, force=True)
    shard = ckpt / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[10_000] ^= 1
    shard.write_bytes(data)
    result = verify_checkpoint(str(ckpt)).result
    assert [f.code for f in result.findings] == ["digest-mismatch"]
    assert "bytes 8192..12288" in result.findings[0].message


@pytest.mark.parametrize(("new_size", "how"), [(1000, "truncated"), (0, "truncated")])
def test_truncated_and_zero_byte_shards(demo_run: Path, sqlite_url: str, new_size: int, how: str) -> None:
    shard = demo_run / "step-30" / "__0_0.distcp"
    with open(shard, "r+b") as f:
        f.truncate(new_size)
    outcome = _drill(demo_run, sqlite_url)
    assert outcome.status == "failed"
    (finding,) = _integrity(outcome).findings
    assert finding.code == "size-mismatch" and how in finding.message and finding.actual == new_size


def test_deleted_shard(demo_run: Path, sqlite_url: str) -> None:
    os.remove(demo_run / "step-30" / "__0_0.distcp")
    outcome = _drill(demo_run, sqlite_url)
    assert outcome.exit_code == ExitCode.FAILED
    assert _codes(outcome) == [("file-missing", "__0_0.distcp")]


def test_extra_stray_file(demo_run: Path, sqlite_url: str) -> None:
    (demo_run / "step-30" / "stray.bin").write_bytes(b"not part of the save")
    outcome = _drill(demo_run, sqlite_url)
    assert outcome.status == "failed"
    assert _codes(outcome) == [("file-unlisted", "stray.bin")]


def test_two_equal_size_shards_swapped(tmp_path: Path, sqlite_url: str) -> None:
    ckpt = tmp_path / "run" / "step-1"
    state = {name: {"w": torch.full((4096,), float(i))} for i, name in enumerate(("model", "optimizer"))}
    with pytest.warns(UserWarning):
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(ckpt), thread_count=2))
    a, b = ckpt / "__0_0.distcp", ckpt / "__0_1.distcp"
    assert a.stat().st_size == b.stat().st_size
    seal(ckpt)
    tmp = ckpt / "swap"
    a.rename(tmp), b.rename(a), tmp.rename(b)
    result = verify_checkpoint(str(ckpt)).result
    assert sorted((f.code, f.subject) for f in result.findings) == [
        ("digest-mismatch", "__0_0.distcp"),
        ("digest-mismatch", "__0_1.distcp"),
    ]


def test_manifest_edited_by_hand(demo_run: Path, sqlite_url: str) -> None:
    path = demo_run / "step-30" / MANIFEST_NAME
    doc = json.loads(path.read_text())
    doc["files"][1]["size"] += 1
    path.write_text(json.dumps(doc))
    outcome = _drill(demo_run, sqlite_url)
    assert outcome.status == "failed"
    assert ("manifest-digest-mismatch", MANIFEST_NAME) in _codes(outcome)


def _one_byte_chunks(doc: dict) -> None:
    doc["chunk_size"] = 1  # every digest now stands for one byte, and there are far too few


def _a_digest_too_many(doc: dict) -> None:
    doc["files"][1]["chunks"].append(doc["files"][1]["chunks"][0])


def _no_digest(doc: dict) -> None:
    doc["files"][1]["chunks"] = []


def _a_negative_size(doc: dict) -> None:
    doc["files"][1]["size"] = -1


@pytest.mark.parametrize("edit", [_one_byte_chunks, _a_digest_too_many, _no_digest, _a_negative_size])
def test_a_manifest_whose_chunks_disagree_with_its_sizes_is_invalid(demo_run: Path, edit) -> None:
    """A manifest that digests itself correctly but whose sizes, chunk size and chunk digests
    disagree is not one drill wrote: refused as it is read, before a byte is hashed by what it
    claims (1-byte chunks of a large shard would have every byte hashed on its own)."""
    from drill.integrity.manifest import self_digest

    path = demo_run / "step-30" / MANIFEST_NAME
    doc = json.loads(path.read_text())
    doc.pop("manifest_xxh3_128")
    edit(doc)
    doc["manifest_xxh3_128"] = self_digest(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(ManifestInvalid) as raised:
        parse_manifest(path.read_bytes())
    assert raised.value.code == "manifest-invalid"
    assert any(
        f"for {f['path']} " in str(raised.value) or f"gives {f['path']} " in str(raised.value) for f in doc["files"]
    )
    result = verify_checkpoint(str(path.parent)).result
    assert result.status is CheckStatus.FAILED
    assert [f.code for f in result.findings if f.subject == MANIFEST_NAME] == ["manifest-invalid"]


def test_manifest_that_is_not_json(demo_run: Path, sqlite_url: str) -> None:
    (demo_run / "step-30" / MANIFEST_NAME).write_bytes(b"\x00garbage{")
    outcome = _drill(demo_run, sqlite_url)
    assert outcome.status == "failed"
    assert _codes(outcome)[0] == ("manifest-not-json", MANIFEST_NAME)
    # the restore still ran, and says the rest of the checkpoint is intact
    assert next(c for c in outcome.checks if c.name == "load").status is CheckStatus.PASSED


class _RecordingStorage(LocalStorage):
    def __init__(self) -> None:
        self.opened: list[str] = []
        self.listed: list[str] = []

    def open(self, uri: str) -> BinaryIO:
        self.opened.append(uri)
        return super().open(uri)

    def list(self, uri: str) -> list:
        self.listed.append(uri)
        return super().list(uri)


def test_verify_lists_a_checkpoint_once_and_still_finds_a_file_changed_after(demo_run: Path) -> None:
    """What the path is and the proof of its files share one listing; the proof reads sizes
    again as it hashes, so a file truncated after the listing is still found."""
    ckpt = demo_run / "step-30"
    storage = _RecordingStorage()
    assert verify_checkpoint(str(ckpt), storage=storage).status == "passed"
    assert storage.listed.count(str(ckpt)) == 1, storage.listed
    shard = next(ckpt.glob("*.distcp"))

    class Truncating(_RecordingStorage):
        def list(self, uri: str) -> list:
            listed = super().list(uri)
            if uri == str(ckpt):
                os.truncate(shard, shard.stat().st_size // 2)  # after the listing, before the read
            return listed

    result = verify_checkpoint(str(ckpt), storage=Truncating()).result
    (error,) = result.errors
    assert error.subject == shard.name and "shrank while it was read" in (error.message or ""), error


@pytest.mark.parametrize("evil", ["../../etc/passwd", "/etc/passwd"])
@pytest.mark.slow
def test_manifest_path_escaping_is_rejected_before_anything_is_opened(
    demo_run: Path, sqlite_url: str, evil: str
) -> None:
    ckpt = demo_run / "step-30"
    manifest, _ = read_manifest(LocalStorage(), str(ckpt))
    assert manifest is not None
    manifest.files[0] = type(manifest.files[0])(evil, 10, "0" * 32, ("0" * 32,))
    (ckpt / MANIFEST_NAME).write_bytes(manifest.to_json())  # a validly self-digested, hostile manifest
    storage = _RecordingStorage()
    outcome = _drill(demo_run, sqlite_url, storage=storage)
    assert outcome.status == "failed"
    assert _codes(outcome) == [("manifest-path-escapes", MANIFEST_NAME)]
    assert [os.path.basename(u) for u in storage.opened] == [MANIFEST_NAME]
    ran = [c.name for c in outcome.checks if c.status is not CheckStatus.SKIPPED]
    assert ran == ["discover", "resume", "integrity"]  # the rest: "not checked: a path leads out of the checkpoint"


@pytest.mark.parametrize(("name", "evil"), [("checkpoint-3", "../../../etc/passwd"), ("weights", "/etc/shadow")])
def test_a_shard_index_naming_a_path_out_is_a_refusal_that_proved_nothing(tmp_path: Path, name: str, evil: str) -> None:
    """A Hugging Face shard index naming a file outside the checkpoint: a failed verification
    naming the index, with nothing proven — not "not a checkpoint" (exit 3), not the level the
    index would have given."""
    safetensors_torch = pytest.importorskip("safetensors.torch", reason="safetensors is not installed")
    ckpt = tmp_path / name  # a trainer's step directory, or a directory of weights alone
    ckpt.mkdir()
    safetensors_torch.save_file({"w": torch.ones(4)}, str(ckpt / "model-00001-of-00002.safetensors"))
    index = {"metadata": {}, "weight_map": {"w": "model-00001-of-00002.safetensors", "x": evil}}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    outcome = verify_checkpoint(str(ckpt))
    assert outcome.status == "failed" and outcome.evidence == "none"
    assert ("manifest-path-escapes", "model.safetensors.index.json") in [
        (f.code, f.subject) for f in outcome.result.findings
    ]


def test_a_seal_naming_a_path_out_proved_nothing(demo_run: Path) -> None:
    ckpt = demo_run / "step-30"
    manifest, _ = read_manifest(LocalStorage(), str(ckpt))
    assert manifest is not None
    manifest.files[0] = type(manifest.files[0])("../outside", 10, "0" * 32, ("0" * 32,))
    (ckpt / MANIFEST_NAME).write_bytes(manifest.to_json())
    outcome = verify_checkpoint(str(ckpt))
    assert outcome.status == "failed" and outcome.evidence == "none"


def test_symlink_leading_out_is_refused(demo_run: Path, tmp_path: Path) -> None:
    (demo_run / "step-30" / "link").symlink_to(tmp_path)
    result = verify_checkpoint(str(demo_run / "step-30")).result
    assert [f.code for f in result.findings] == ["path-escapes"]


def test_unsealed_dcp_metadata_pointing_past_the_end_of_a_file(demo_run: Path, sqlite_url: str) -> None:
    ckpt = demo_run / "step-30"
    os.remove(ckpt / MANIFEST_NAME)
    clean = _drill(demo_run, sqlite_url)
    assert clean.status == "passed"
    assert _integrity(clean).summary == "unsealed: structurally consistent, no content hashes"

    metadata = restricted_loads((ckpt / ".metadata").read_bytes())
    size = (ckpt / "__0_1.distcp").stat().st_size
    last = max((i for i in metadata.storage_data.values() if i.relative_path == "__0_1.distcp"), key=lambda i: i.offset)
    last.length += 100
    (ckpt / ".metadata").write_bytes(pickle.dumps(metadata))
    assert last.offset + last.length > size
    for result in (_integrity(_drill(demo_run, sqlite_url)), verify_checkpoint(str(ckpt)).result):
        assert result.status is CheckStatus.FAILED
        assert ("entry-out-of-bounds", "__0_1.distcp") in [(f.code, f.subject) for f in result.findings]


@pytest.mark.parametrize("sealed", [True, False])
def test_a_shard_that_is_not_a_regular_file_is_named_once(demo_run: Path, sqlite_url: str, sealed: bool) -> None:
    """A FIFO where a shard should be is one finding: the structure (which never opens it) does
    not also call the shard missing from the checkpoint."""
    ckpt = demo_run / "step-30"
    if not sealed:
        os.remove(ckpt / MANIFEST_NAME)
    os.remove(ckpt / "__0_1.distcp")
    os.mkfifo(ckpt / "__0_1.distcp")
    for result in (verify_checkpoint(str(ckpt)).result, _integrity(_drill(demo_run, sqlite_url))):
        assert result.status is CheckStatus.FAILED
        assert [f.code for f in result.findings if f.subject == "__0_1.distcp"] == ["file-not-regular"]


def test_require_sealed(demo_run: Path, sqlite_url: str) -> None:
    os.remove(demo_run / "step-30" / MANIFEST_NAME)
    outcome = _drill(demo_run, sqlite_url, require_sealed=True)
    assert outcome.status == "failed" and ("not-sealed", str(demo_run / "step-30")) in _codes(outcome)


def test_seal_is_idempotent_and_never_silently_replaces(demo_run: Path) -> None:
    ckpt = demo_run / "step-20"
    before = (ckpt / MANIFEST_NAME).read_bytes()
    again = seal(ckpt)
    assert not again.written and (ckpt / MANIFEST_NAME).read_bytes() == before
    (ckpt / "__0_0.distcp").write_bytes(b"changed after sealing")
    with pytest.raises(SealConflict, match="seals different content"):
        seal(ckpt)
    assert (ckpt / MANIFEST_NAME).read_bytes() == before
    forced = seal(ckpt, force=True)
    assert forced.written and parse_manifest((ckpt / MANIFEST_NAME).read_bytes()).by_path()["__0_0.distcp"].size == 21
    assert not [p for p in ckpt.iterdir() if p.name.endswith(".tmp")]


def test_megatron_integrity_json_is_verified_in_the_same_read(demo_run: Path, sqlite_url: str) -> None:
    ckpt = demo_run / "step-30"
    shas = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in ckpt.iterdir() if p.name.endswith(".distcp")}
    (ckpt / "integrity.json").write_text(json.dumps({"algorithm": "sha256", "files": shas}))
    clean = _drill(demo_run, sqlite_url)
    assert clean.status == "passed"
    assert (
        _integrity(clean).evidence["manifests"]["integrity.json"]
        == "integrity.json proved the content (SHA-256 per file) for 2 of 2 files"
    )
    assert _integrity(clean).evidence["manifests"][MANIFEST_NAME] == "proved the content of 3 of 3 files"

    shas["__0_0.distcp"] = "0" * 64
    (ckpt / "integrity.json").write_text(json.dumps({"algorithm": "sha256", "files": shas}))
    outcome = _drill(demo_run, sqlite_url)
    assert outcome.status == "failed"
    (finding,) = _integrity(outcome).findings
    assert finding.code == "digest-mismatch" and "integrity.json" in finding.message


def test_safetensors_index_proves_shard_presence(tmp_path: Path) -> None:
    safetensors_torch = pytest.importorskip("safetensors.torch", reason="safetensors is not installed")
    ckpt = tmp_path / "model-export"  # what save_pretrained writes: shards and their index
    ckpt.mkdir()
    safetensors_torch.save_file({"a": torch.ones(3)}, str(ckpt / "model-00001-of-00002.safetensors"))
    index = {
        "metadata": {},
        "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"},
    }
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    result = verify_checkpoint(str(ckpt)).result
    assert [(f.code, f.subject) for f in result.findings] == [("file-missing", "model-00002-of-00002.safetensors")]
    assert "model.safetensors.index.json" in result.evidence["manifests"]
    # named as a trainer's step directory but without the trainer's commit marker: an incomplete save too
    ckpt = ckpt.rename(tmp_path / "checkpoint-5")
    result = verify_checkpoint(str(ckpt)).result
    assert [f.code for f in result.findings] == ["incomplete-save", "file-missing"]


def test_single_file_structural_proofs(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.pt"
    torch.save({"model": {"w": torch.arange(1000.0)}, "iter_num": 5}, path)
    ok = verify_checkpoint(str(path)).result
    assert ok.status is CheckStatus.PASSED and "CRC-32" in ok.summary
    data = bytearray(path.read_bytes())
    data[data.find(b"\x00\x00\x80\x3f") + 1] ^= 0xFF  # damage the tensor bytes, not the headers
    path.write_bytes(data)
    bad = verify_checkpoint(str(path)).result
    assert [f.code for f in bad.findings] == ["crc-mismatch"]


def test_safetensors_structural_proof(tmp_path: Path) -> None:
    safetensors_torch = pytest.importorskip("safetensors.torch", reason="safetensors is not installed")
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file({"a": torch.ones(10), "b": torch.zeros(5)}, str(path))
    assert verify_checkpoint(str(path)).result.status is CheckStatus.PASSED
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 8)
    bad = verify_checkpoint(str(path)).result
    assert "entry-out-of-bounds" in [f.code for f in bad.findings]


def _safetensors_file(path: Path, header: dict, data: bytes) -> None:
    import struct

    body = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body + data)


def test_a_safetensors_header_whose_shapes_disagree_with_its_offsets_is_not_consistent(tmp_path: Path) -> None:
    """What ``verify`` calls structurally consistent a restore can load: a shape and dtype that
    need other bytes than the offsets give (a 2^60-element tensor in 4,000 bytes) is corrupt, for
    both alike; fp8 and sub-byte dtypes are held to what their width allows."""
    from drill.formats.safeload import load_safetensors

    path = tmp_path / "model.safetensors"
    _safetensors_file(
        path, {"w": {"dtype": "F32", "shape": [1 << 30, 1 << 30], "data_offsets": [0, 4000]}}, bytes(4000)
    )
    result = verify_checkpoint(str(path)).result
    assert [f.code for f in result.findings] == ["safetensors-corrupt"] and "needs" in result.findings[0].message
    with pytest.raises(ValueError, match="needs"):
        load_safetensors(memoryview(path.read_bytes()), torch.device("cpu"))
    fine = {
        "a": {"dtype": "F8_E4M3", "shape": [2, 3], "data_offsets": [0, 6]},
        "b": {"dtype": "F4", "shape": [4], "data_offsets": [6, 8]},
        "c": {"dtype": "BF16", "shape": [], "data_offsets": [8, 10]},
    }
    _safetensors_file(path, fine, bytes(10))
    assert verify_checkpoint(str(path)).result.status is CheckStatus.PASSED


def test_a_check_names_at_most_a_hundred_findings_of_a_code_and_counts_the_rest(tmp_path: Path) -> None:
    """A header of 5,000 tensors all at byte 0: 4,999 overlaps are a report a person reads —
    99 of them and one counting the rest — and a record a database holds."""
    path = tmp_path / "model.safetensors"
    _safetensors_file(
        path, {f"w{i}": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]} for i in range(5000)}, bytes(4)
    )
    result = verify_checkpoint(str(path)).result
    codes = [f.code for f in result.findings]
    assert codes == ["entries-overlap"] * 100 and result.status is CheckStatus.FAILED
    assert result.findings[-1].message == "and 4900 more entries-overlap findings like those above (4999 in all)"
    assert CheckResult.from_dict(result.to_dict()).findings == result.findings  # bounding twice changes nothing


def test_unsealed_bit_flip_is_caught_by_the_entries_own_crcs(demo_run: Path, sqlite_url: str) -> None:
    """No seal to prove the bytes: every entry is held to the CRC-32s torch.save wrote, so a
    flipped bit in a tensor is a finding naming it, not a silently different weight."""
    from tests.conftest import drill as _drill

    ckpt = max(demo_run.glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
    (ckpt / "drill-manifest.json").unlink()
    shard = ckpt / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    outcome = _drill(demo_run, sqlite_url)
    crc = [f for f in outcome.findings if f.code == "crc-mismatch"]
    assert outcome.status.value == "failed" and len(crc) == 1 and crc[0].check == "load"
    assert crc[0].subject and crc[0].subject.count(".") >= 2  # the tensor's name


def test_spans_of_a_large_file_hash_as_one_stream_does(tmp_path: Path) -> None:
    """A file of many chunks is hashed in spans on several threads: the same digests as one
    sequential read, and a size that changed since the listing is still caught."""
    from drill.integrity.parallel import hash_files
    from drill.integrity.reading import hash_stream

    data = os.urandom(1_000_003)
    (tmp_path / "big").write_bytes(data)
    storage, chunk = LocalStorage(), 64 << 10
    whole = hash_stream(storage, str(tmp_path / "big"), len(data), chunk_size=chunk)
    for workers in (1, 3, 4, 16):
        spanned = hash_files(storage, str(tmp_path), {"big": len(data)}, chunk, workers=workers)["big"]
        assert not isinstance(spanned, OSError)
        assert (spanned.size, spanned.chunks, spanned.digest) == (whole.size, whole.chunks, whole.digest)
    shrank = hash_files(storage, str(tmp_path), {"big": len(data) + 5 * chunk}, chunk)["big"]
    grew = hash_files(storage, str(tmp_path), {"big": len(data) - 5 * chunk}, chunk)["big"]
    assert isinstance(shrank, OSError) and "shrank" in str(shrank)
    assert isinstance(grew, OSError) and f"{len(data)} bytes by the end of the read" in str(grew)


def test_storage_without_positioned_reads_streams_each_file_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Object storage reads ahead by itself: its files are hashed whole, one stream each."""
    import drill.integrity.parallel as parallel

    class Streaming(LocalStorage):
        positioned_reads = False

    data = os.urandom(300_001)
    (tmp_path / "big").write_bytes(data)
    monkeypatch.setattr(parallel, "span_digests", lambda *a, **k: pytest.fail("a span was read"))
    monkeypatch.setattr("drill.proc.may_fork", lambda: pytest.fail("a fork was considered"))
    got = parallel.hash_files(Streaming(), str(tmp_path), {"big": len(data)}, 16 << 10)["big"]
    from drill.integrity.reading import hash_stream

    assert (
        not isinstance(got, OSError)
        and got.chunks == hash_stream(LocalStorage(), str(tmp_path / "big"), chunk_size=16 << 10).chunks
    )


@pytest.mark.parametrize("replay", [True, False])
@pytest.mark.slow
def test_a_flip_under_a_recomputed_unkeyed_seal_is_still_a_crc_finding(
    demo_run: Path, sqlite_url: str, replay: bool
) -> None:
    """Whoever flips a bit can recompute an unkeyed manifest; the CRC-32s torch.save wrote
    into every entry are a second witness that keeps running under a seal: the drill fails
    (exit 1, crc-mismatch naming the tensor) with and without the replay — never an error,
    never a pass — and drill.sdk.load refuses it too."""
    from drill import sdk
    from drill.replay import ReplaySpec

    ckpt = demo_run / "step-30"
    shard = ckpt / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10
    shard.write_bytes(bytes(data))
    seal(str(ckpt), force=True)
    outcome = drill(demo_run, sqlite_url, replay=ReplaySpec(enabled=replay, steps=1))
    assert (outcome.status.value, int(outcome.exit_code)) == ("failed", 1), outcome.message
    assert any(f.code == "crc-mismatch" for f in outcome.findings), [(f.code, f.message) for f in outcome.findings]
    assert _integrity(outcome).status is CheckStatus.PASSED  # the seal itself matches: it was recomputed
    if not replay:
        from drill.demo.config import DemoConfig
        from drill.demo.train import build

        objs = build(DemoConfig(**json.loads((demo_run / "run.json").read_text())["config"]))
        with pytest.raises(sdk.CheckpointCorrupt, match="CRC"):
            sdk.load(objs.stateful(), str(ckpt), record=False)


def _deep(top: Path, depth: int) -> None:
    """``top/d/d/…/d``, ``depth`` levels: built through directory descriptors (the full path is
    far past PATH_MAX)."""
    top.mkdir()
    fds = [os.open(top, os.O_RDONLY)]
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fds[-1])
            fds.append(os.open("d", os.O_RDONLY, dir_fd=fds[-1]))
    finally:
        for fd in fds:
            os.close(fd)


def _remove_deep(top: Path) -> None:
    """Remove what :func:`_deep` built, bottom up (shutil.rmtree recurses once per level)."""
    fds = [os.open(top, os.O_RDONLY)]
    while "d" in os.listdir(fds[-1]):
        fds.append(os.open("d", os.O_RDONLY, dir_fd=fds[-1]))
    while len(fds) > 1:
        os.close(fds.pop())
        os.rmdir("d", dir_fd=fds[-1])
    os.close(fds[0])
    top.rmdir()


@pytest.mark.parametrize("sealed", [True, False])
@pytest.mark.parametrize("hazard", ["a symlink loop", "a link cycle", "a 10,000-deep directory"])
@pytest.mark.slow
def test_a_link_loop_or_deep_tree_in_a_checkpoint_is_a_finding_on_that_path(
    demo_run: Path, sqlite_url: str, hazard: str, sealed: bool
) -> None:
    """Neither a RecursionError nor an undrillable run: the path is named, the checkpoint
    fails (run and verify alike), and the run's other checkpoints still drill."""
    ckpt = demo_run / "step-30"
    if not sealed:
        (ckpt / MANIFEST_NAME).unlink()
    name = {"a symlink loop": "self", "a link cycle": "a", "a 10,000-deep directory": "deep"}[hazard]
    if hazard == "a symlink loop":
        os.symlink("self", ckpt / "self")
    elif hazard == "a link cycle":
        os.symlink("b", ckpt / "a")
        os.symlink("a", ckpt / "b")
    else:
        _deep(ckpt / "deep", 10_000)
    try:
        outcome = _drill(demo_run, sqlite_url)
        assert (outcome.status.value, int(outcome.exit_code)) == ("failed", 1), outcome.message
        assert any(
            f.subject is not None and f.subject.startswith(name)
            for f in outcome.findings
            if f.severity.value == "error"
        ), [(f.code, f.subject) for f in outcome.findings]
        verified = verify_checkpoint(str(ckpt)).result
        assert verified.status is CheckStatus.FAILED and any(
            (f.subject or "").startswith(name) for f in verified.findings
        )
        other = drill(demo_run, sqlite_url, "step:20")
        assert other.status.value == "passed", (other.message, other.error)
    finally:
        if hazard == "a 10,000-deep directory":
            _remove_deep(ckpt / "deep")


def test_a_symlink_loop_in_the_run_root_leaves_the_run_drillable(demo_run: Path, sqlite_url: str) -> None:
    os.symlink("step-99", demo_run / "step-99")
    outcome = _drill(demo_run, sqlite_url)
    assert outcome.status.value == "passed", outcome.message
    discover = next(c for c in outcome.checks if c.name == "discover")
    assert "step-99" in json.dumps(discover.evidence)


def test_a_sparse_terabyte_beside_a_sealed_checkpoint_is_unlisted_unread(demo_run: Path, sqlite_url: str) -> None:
    """Bounded in time whatever is planted: a file the seal does not list is named, never read."""
    ckpt = demo_run / "step-30"
    with open(ckpt / "huge.bin", "wb") as f:
        f.truncate(1 << 40)  # sparse: 1 TiB on paper, nothing on disk
    outcome = _drill(demo_run, sqlite_url)
    verified = verify_checkpoint(str(ckpt))
    assert ("file-unlisted", "huge.bin") in _codes(outcome)
    assert outcome.bytes_read is not None and outcome.bytes_read < 1 << 30
    assert ("file-unlisted", "huge.bin") in [(f.code, f.subject) for f in verified.result.findings]
    assert verified.bytes_hashed < 1 << 30


@pytest.mark.parametrize("size", [0, 1, (1 << 20) - 1, 1 << 20, (4 << 20) + 3, (17 << 20) + 5])
@pytest.mark.parametrize("lane", [False, True])
def test_one_pass_read_hashes_and_crcs_exactly_what_two_passes_would(tmp_path: Path, size: int, lane: bool) -> None:
    """A tensor's bytes are hashed and CRC'd piece by piece as they land (on the CRC lane for
    large entries): the chunk digests and the CRC-32 equal those of the whole buffer taken
    afterwards, whatever the size against the piece, batch and chunk boundaries."""
    import zlib

    from drill.integrity.hashing import ChunkHasher
    from drill.integrity.reading import Crc, CrcLane, SequentialReader

    data = os.urandom(size + 7)
    (tmp_path / "f").write_bytes(data)
    target = memoryview(bytearray(size))
    running = CrcLane() if lane else Crc()
    with open(tmp_path / "f", "rb", buffering=0) as f:
        reader = SequentialReader(f, len(data), ChunkHasher(chunk_size=1 << 20))
        reader.skip_to(7)
        reader.read_into(target, running.begin() if isinstance(running, CrcLane) else running)
        got = running.value()
        hashes = reader.finish()
    if isinstance(running, CrcLane):
        running.close()
    whole = ChunkHasher(chunk_size=1 << 20)
    whole.update(data)
    assert bytes(target) == data[7:]
    assert got == zlib.crc32(data[7:])
    assert hashes is not None and hashes.chunks == whole.finish().chunks


def test_the_lane_hashes_in_read_order_however_lane_and_inline_reads_alternate(tmp_path: Path) -> None:
    """Reads into targets hand their hashing to the lane, the rest (headers, gaps) hash on the
    reader's thread: the chunk digests are the whole file's whatever the order and wherever a
    chunk boundary falls, and each target's CRC-32 is its own bytes'."""
    import threading
    import zlib

    from drill.integrity.hashing import ChunkHasher
    from drill.integrity.reading import CrcLane, SequentialReader

    layout = [("gap", 5), ("lane", (3 << 20) + 1), ("lane", 1 << 20), ("head", 333), ("lane", 2 << 20), ("gap", 99)]
    layout += [("head", 1), ("lane", 7), ("gap", (64 << 10) + 3), ("lane", 9), ("head", 70_000)]
    layout += [("lane", (1 << 20) + 17)]
    data = os.urandom(sum(n for _, n in layout) + 11)
    (tmp_path / "f").write_bytes(data)

    class Lagging(ChunkHasher):
        """The lane falls behind the reader at each target's first piece: a reader that did not
        wait for it would hash the next header first."""

        def update(self, data: memoryview | bytes) -> None:
            if threading.current_thread() is not threading.main_thread() and len(data) > 4096:
                threading.Event().wait(0.05)
            super().update(data)

    lane, crcs, at = CrcLane(), [], 0
    with open(tmp_path / "f", "rb", buffering=0) as f:
        reader = SequentialReader(f, len(data), Lagging(chunk_size=1 << 20))
        for how, n in layout:
            if how == "gap":
                reader.skip_to(at + n)
            elif how == "head":
                assert bytes(reader.read(n)) == data[at : at + n]
            else:
                target = memoryview(bytearray(n))
                reader.read_into(target, lane.begin())
                lane.end()
                crcs.append((lane, zlib.crc32(data[at : at + n]), bytes(target) == data[at : at + n]))
            at += n
        hashes = reader.finish()
    assert [(ln.result(), want, landed) for ln, want, landed in crcs] == [(want, want, True) for _, want, _ in crcs]
    lane.close()
    whole = ChunkHasher(chunk_size=1 << 20)
    whole.update(data)
    assert hashes is not None and hashes.chunks == whole.finish().chunks


@pytest.mark.parametrize(("between", "waits"), [(200, 0), (64 << 10, 0), ((64 << 10) + 1, 1)])
def test_small_reads_between_targets_go_to_the_lane_and_the_reader_does_not_wait(
    tmp_path: Path, between: int, waits: int
) -> None:
    """A header or trailer read while the lane holds the hasher is handed to it as a copy, in
    order — the reader waits for the lane (a drain) only before a larger read it hashes itself,
    and at the end; the digests are the whole file's either way."""
    from drill.integrity.hashing import ChunkHasher
    from drill.integrity.reading import CrcLane, SequentialReader

    class Counted(CrcLane):
        drains = 0

        def drain(self) -> None:
            Counted.drains += 1
            super().drain()

    data = os.urandom((2 << 20) + between + 5)
    (tmp_path / "f").write_bytes(data)
    lane = Counted()
    with open(tmp_path / "f", "rb", buffering=0) as f:
        reader = SequentialReader(f, len(data), ChunkHasher(chunk_size=1 << 20))
        reader.read_into(memoryview(bytearray(1 << 20)), lane.begin())
        lane.end()
        assert bytes(reader.read(between)) == data[1 << 20 : (1 << 20) + between]
        reader.read_into(memoryview(bytearray(1 << 20)), lane.begin())
        lane.end()
        assert Counted.drains == waits
        hashes = reader.finish()
    lane.close()
    whole = ChunkHasher(chunk_size=1 << 20)
    whole.update(data)
    assert hashes is not None and hashes.chunks == whole.finish().chunks


def test_a_lane_that_fails_says_so_at_the_next_drain_and_never_hangs_the_reader() -> None:
    from drill.integrity.reading import CrcLane

    class Broken:
        def update(self, piece: object) -> None:
            raise ValueError("the hasher broke")

    lane = CrcLane().begin()
    lane.hashing(Broken())  # type: ignore[arg-type]
    lane.update(memoryview(b"x" * 10))
    with pytest.raises(ValueError, match="the hasher broke"):
        lane.drain()
    lane.hashing(None)
    lane.update(memoryview(b"x" * 10))
    lane.drain()  # the lane goes on
    assert lane.value() == __import__("zlib").crc32(b"x" * 20)
    lane.close()


def test_a_flip_in_a_large_tensor_is_caught_by_the_crc_lane(tmp_path: Path) -> None:
    """An entry large enough for the CRC lane, damaged and resealed: the CRC-32 taken beside
    the read still names it."""
    from drill import sdk
    from drill.integrity.reading import LANE_MIN

    ckpt = tmp_path / "ckpt"
    state = {"big": torch.randn(LANE_MIN // 4 + 1000), "small": torch.randn(10)}
    dcp.save(state, checkpoint_id=str(ckpt), no_dist=True)
    shard = ckpt / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    seal(str(ckpt))
    targets = {"big": torch.zeros_like(state["big"]), "small": torch.zeros_like(state["small"])}
    with pytest.raises(sdk.CheckpointCorrupt, match="CRC"):
        sdk.load(targets, str(ckpt), record=False)


def test_a_lane_that_lags_behind_the_last_tensor_still_hashes_the_file_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last entry is large (its CRC and hashing on the lane) and the lane lags behind the
    reader: the file's trailing bytes are still hashed after it, and the lane is closed only once
    it has hashed everything — a sealed, undamaged checkpoint loads verified, every time."""
    import threading

    import drill.formats.dcp_read as dcp_read
    from drill import sdk
    from drill.integrity.hashing import ChunkHasher
    from drill.integrity.reading import LANE_MIN

    class Lagging(ChunkHasher):
        def update(self, data: memoryview | bytes) -> None:
            if threading.current_thread().name == "drill-crc":
                threading.Event().wait(0.002)
            super().update(data)

    ckpt = tmp_path / "ckpt"
    state = {"a": torch.randn(10), "z": torch.randn(LANE_MIN // 4 + 1000)}  # DCP writes "z" last
    sdk.save(state, str(ckpt), no_dist=True)
    monkeypatch.setattr(dcp_read, "ChunkHasher", Lagging)
    targets = {k: torch.zeros_like(v) for k, v in state.items()}
    report = sdk.load(targets, str(ckpt), record=False)
    assert report.sealed and report.verified_files > 0
    assert all(torch.equal(targets[k], state[k]) for k in state)


@pytest.mark.parametrize(
    "path", ["", "/etc/passwd", "//host/x", "../x", "a/../../x", "a/..", "~root/x", "a\\..\\x", "a\x00b"]
)
def test_a_manifest_path_that_could_leave_the_checkpoint_is_refused(path: str) -> None:
    from drill.integrity.manifest import ManifestInvalid, check_relative_path

    with pytest.raises(ManifestInvalid) as caught:
        check_relative_path(path)
    assert caught.value.code == "manifest-path-escapes"
    for inside in ("a", "sub/a.distcp", "./a", "a/./b", "a..b", "..a"):  # dots in a name are not a parent
        check_relative_path(inside)


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("size", True, "size (bool"),
        ("size", 16.0, "size (float"),
        ("path", 7, "path (int"),
        ("xxh3_128", None, "xxh3_128 (NoneType"),
        ("chunks", "ab", "chunks (str"),
        ("chunks", [1], "chunk digest (int"),
        ("path", "missing", "'path'"),
        (None, ["a", 1], "list"),
    ],
)
def test_a_manifest_entry_of_the_wrong_json_type_is_invalid_and_names_its_field(
    field: str | None, value: object, named: str
) -> None:
    """Each file's fields are exactly the JSON types drill writes — checked before the digest,
    so a manifest re-digested after the edit is still refused, with the field named."""
    from drill.integrity.manifest import DIGESTS, ManifestInvalid, parse_manifest, self_digest

    doc = {"format": "drill-manifest", "version": 1, "step": 1, "created_at": "t", "chunk_size": 16, "frameworks": {}}
    entry: object = {"path": "a.distcp", "size": 16, "xxh3_128": "00", "chunks": ["00"]}
    if field is None:
        entry = value
    elif value == "missing":
        del entry[field]  # type: ignore[attr-defined]
    else:
        entry[field] = value  # type: ignore[index]
    doc["files"] = [{"path": "b.distcp", "size": 1, "xxh3_128": "01", "chunks": ["01"]}, entry]
    doc["manifest_xxh3_128"] = self_digest({k: v for k, v in doc.items() if k not in DIGESTS})
    with pytest.raises(ManifestInvalid) as invalid:
        parse_manifest(json.dumps(doc).encode())
    assert invalid.value.code == "manifest-invalid" and named in str(invalid.value), invalid.value


def test_a_nested_shard_index_names_shards_beside_itself(tmp_path: Path) -> None:
    """An index in a subdirectory of a checkpoint names the shards beside it, not at the top
    (they were reported "listed but missing")."""
    from drill.integrity.foreign import find_foreign_manifests

    sub = tmp_path / "ckpt" / "adapter"
    sub.mkdir(parents=True)
    (sub / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "model-1.safetensors"}}))
    found = find_foreign_manifests(LocalStorage(), str(tmp_path / "ckpt"), {"adapter/model.safetensors.index.json"})
    assert [m.listed for m in found] == [{"adapter/model-1.safetensors"}]


def test_seal_of_a_directory_the_storage_will_not_list_is_a_storage_error_and_seals_nothing(tmp_path: Path) -> None:
    """A directory below the checkpoint that cannot be listed (permission denied, as /proc's
    links are) was an internal error of ``drill seal`` (exit 70, ``PermissionError``); it is the
    storage's (exit 5), and no manifest is written."""
    from drill.errors import StorageProblem
    from drill.verifier import seal as seal_checkpoint

    class Denying(LocalStorage):
        def list(self, uri: str):  # type: ignore[no-untyped-def]
            if uri.endswith("/private"):
                raise PermissionError(13, "Permission denied", uri)
            return super().list(uri)

    ckpt = tmp_path / "step-1"
    with pytest.warns(UserWarning):
        dcp.save({"w": torch.ones(4)}, checkpoint_id=str(ckpt))
    (ckpt / "private").mkdir()
    with pytest.raises(StorageProblem, match="Permission denied") as raised:
        seal_checkpoint(str(ckpt), storage=Denying())
    assert raised.value.exit_code == ExitCode.ERROR
    assert not (ckpt / MANIFEST_NAME).exists()


def test_seal_of_a_directory_of_runs_names_them_and_seals_nothing(demo_run: Path, tmp_path: Path) -> None:
    """``drill seal /`` walked the whole filesystem (and failed on /proc); a directory holding
    runs is refused as ``verify`` refuses it: sealed, it would vouch for their files as one
    checkpoint's."""
    from drill.errors import UsageError
    from drill.verifier import seal as seal_checkpoint

    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "a").symlink_to(demo_run)
    with pytest.raises(UsageError, match=r"is a directory of runs or checkpoints \(a\)"):
        seal_checkpoint(str(runs))
    assert not (runs / MANIFEST_NAME).exists()


def test_skips_read_through_a_scratch_buffer_no_larger_than_the_longest_skip(tmp_path: Path) -> None:
    """The bytes between a checkpoint's tensors (a few hundred) are read through a small buffer
    that grows with the longest skip, up to READ_CHUNK — never a zeroed 8 MiB one for a header
    (its page faults were 3-4 ms of a 0.3 GB load) — and every byte skipped is still hashed."""
    from drill.integrity.hashing import ChunkHasher
    from drill.integrity.reading import READ_CHUNK, SCRATCH_MIN, SequentialReader

    data = os.urandom(300 + (100 << 10) + READ_CHUNK + 5)
    (tmp_path / "f").write_bytes(data)
    with open(tmp_path / "f", "rb", buffering=0) as f:
        reader = SequentialReader(f, len(data), ChunkHasher(chunk_size=1 << 20))
        reader.skip_to(300)
        assert reader._scratch is not None and len(reader._scratch) == SCRATCH_MIN
        reader.skip_to(300 + (100 << 10))
        assert len(reader._scratch) == 100 << 10
        reader.skip_to(len(data))
        assert len(reader._scratch) == READ_CHUNK
        hashes = reader.finish()
    whole = ChunkHasher(chunk_size=1 << 20)
    whole.update(data)
    assert hashes is not None and hashes.chunks == whole.finish().chunks
