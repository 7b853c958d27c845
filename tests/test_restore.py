"""The DCP restore engine: reads every byte once, loads every tensor, never runs checkpoint code."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from drill.demo.train import build
from drill.discover import discover
from drill.formats import restore
from drill.storage import LocalStorage
from tests.conftest import SMALL_RUN


def _latest(run: Path):
    return discover(LocalStorage(), str(run)).checkpoints[-1]


@pytest.mark.slow
def test_restore_reads_every_byte_and_matches_a_plain_dcp_load(pristine_run: Path) -> None:
    ref = _latest(pristine_run)
    result = restore(LocalStorage(), ref, torch.device("cpu"))
    on_disk = sum(p.stat().st_size for p in Path(ref.uri).iterdir() if p.name != "drill-manifest.json")
    assert result.bytes_read == on_disk
    assert not result.failures and result.metadata_error is None

    objs = build(SMALL_RUN)
    dcp.load(objs.stateful(), checkpoint_id=ref.uri, no_dist=True)
    for name, tensor in objs.model.state_dict().items():
        assert torch.equal(result.state[f"model.{name}"], tensor), name
    assert result.state["train_state.step"] == 30
    assert result.state["dataloader.seed"] == SMALL_RUN.seed


def test_missing_shard_is_recorded_not_raised(demo_run: Path) -> None:
    ref = _latest(demo_run)
    os.remove(Path(ref.uri) / "__0_1.distcp")
    result = restore(LocalStorage(), ref, torch.device("cpu"))
    broken = [f for f in result.files if f.error_kind]
    assert [(f.relative_path, f.error_kind) for f in broken] == [("__0_1.distcp", "missing")]
    assert result.failures and all(f.relative_path == "__0_1.distcp" for f in result.failures)
    assert result.tensors_loaded > 0  # the other shard still loaded


def test_truncated_shard_names_the_entries_past_its_end(demo_run: Path) -> None:
    ref = _latest(demo_run)
    shard = Path(ref.uri) / "__0_0.distcp"
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(size // 2)
    result = restore(LocalStorage(), ref, torch.device("cpu"))
    assert any("past the end of the file" in f.reason for f in result.failures)


class _Payload:
    """A pickle that would create a marker file when unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_metadata_never_runs(demo_run: Path, tmp_path: Path) -> None:
    ref = _latest(demo_run)
    marker = tmp_path / "pwned"
    (Path(ref.uri) / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    result = restore(LocalStorage(), ref, torch.device("cpu"))
    assert result.metadata_error is not None and "allow-list" in result.metadata_error
    assert not marker.exists()


def test_malicious_value_entry_never_runs(tmp_path: Path) -> None:
    """A non-tensor entry is deserialized with weights_only=True: a payload is refused."""
    marker = tmp_path / "pwned"
    ckpt = tmp_path / "step-1"
    with pytest.warns(UserWarning):
        dcp.save({"model": {"w": torch.ones(2)}, "extra": {"evil": _Payload(marker)}}, checkpoint_id=str(ckpt))
    ref = discover(LocalStorage(), str(ckpt)).checkpoints[0]
    result = restore(LocalStorage(), ref, torch.device("cpu"))
    assert [f.key for f in result.failures] == ["extra.evil"]
    assert not marker.exists()
    assert torch.equal(result.state["model.w"], torch.ones(2))


def test_metadata_path_escaping_the_checkpoint_is_never_opened(demo_run: Path, tmp_path: Path) -> None:
    """A .metadata whose storage entries point outside the checkpoint is refused per file."""
    from drill.safe_pickle import restricted_loads

    ref = _latest(demo_run)
    meta_path = Path(ref.uri) / ".metadata"
    metadata = restricted_loads(meta_path.read_bytes())
    outside = tmp_path / "outside.distcp"
    outside.write_bytes((Path(ref.uri) / "__0_0.distcp").read_bytes())
    for info in metadata.storage_data.values():
        if info.relative_path == "__0_0.distcp":
            info.relative_path = "../../outside.distcp"
    meta_path.write_bytes(pickle.dumps(metadata))
    result = restore(LocalStorage(), ref, torch.device("cpu"))
    escaped = [f for f in result.files if f.error_kind == "escapes"]
    assert [f.relative_path for f in escaped] == ["../../outside.distcp"]
    assert escaped[0].bytes_read == 0


def test_symlink_leading_out_is_refused(demo_run: Path, tmp_path: Path) -> None:
    ref = _latest(demo_run)
    shard = Path(ref.uri) / "__0_0.distcp"
    outside = tmp_path / "elsewhere.distcp"
    shard.rename(outside)
    shard.symlink_to(outside)
    result = restore(LocalStorage(), ref, torch.device("cpu"))
    assert [f.relative_path for f in result.files if f.error_kind == "escapes"] == ["__0_0.distcp"]


@pytest.mark.slow
def test_a_cold_drill_drops_the_checkpoint_from_the_page_cache_and_says_so(demo_run, tmp_path) -> None:
    """--cold: every file of the checkpoint is dropped from the page cache before the restore
    (mincore says none of it is resident), so the restore reads from the disk — and afterwards
    it is resident again, read by the drill. A warm drill says how much was cached."""
    import json as _json
    import subprocess as _sp
    import sys as _sys

    from drill.storage.pagecache import resident_bytes

    db = f"sqlite:///{tmp_path / 'drill.db'}"
    ckpt = sorted(p for p in demo_run.iterdir() if p.name.startswith("step-"))[-1]
    files = [p for p in ckpt.iterdir() if p.is_file() and p.name != "drill-manifest.json"]
    for p in files:
        p.read_bytes()  # warm
    assert sum(resident_bytes(str(p)) for p in files) > 0
    res = _sp.run(
        [
            _sys.executable,
            "-m",
            "drill",
            "run",
            "--root",
            str(demo_run),
            "--db",
            db,
            "--no-replay",
            "--cold",
            "--json",
            "-q",
        ],
        capture_output=True,
        text=True,
    )
    doc = _json.loads(res.stdout)
    assert doc["status"] == "passed" and "--cold" in doc["options"]["flags"] and doc["options"]["cold"] is True
    cache = doc["page_cache"]
    assert cache["cold"] is True and cache["resident"] == 0 and cache["bytes"] == sum(p.stat().st_size for p in files)
    assert sum(resident_bytes(str(p)) for p in files) > 0  # the drill's own read brought them back
    res = _sp.run(
        [_sys.executable, "-m", "drill", "run", "--root", str(demo_run), "--db", db, "--no-replay", "--json", "-q"],
        capture_output=True,
        text=True,
    )
    warm = _json.loads(res.stdout)["page_cache"]
    assert warm["cold"] is False and warm["resident"] > 0
    show = _sp.run(
        [_sys.executable, "-m", "drill", "show", str(doc["id"]), "--db", db], capture_output=True, text=True
    ).stdout
    assert "read from" in show and "cold: 0 B (0%)" in show
