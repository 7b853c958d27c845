"""Distributed drills on real ranks: a checkpoint sharded by 4 CPU ranks (FSDP2, gloo) drilled
by 2, 3 and 1 processes launched the way srun launches them (RANK/WORLD_SIZE, a file://
rendezvous: nothing listens on a port); ranks killed and hung by failpoints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drill import get_drill, history
from drill.checks.contract import check_dataloader, check_rng
from drill.formats.canonical import Layout

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("sharded") / "run"
    subprocess.run(
        [sys.executable, "-m", "drill", "demo", str(run), "--ranks", "4", "--steps", "20", "--save-every", "10", "--keep", "2"],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return run


def launch(world: int, args: list[str], tmp_path: Path, *, env: dict[str, str] | None = None, timeout: float = 180) -> list[subprocess.CompletedProcess]:
    """``drill run ARGS`` as ``world`` ranks, each its own process, as srun would start them."""
    rdzv = tmp_path / f"rdzv-{time.monotonic_ns()}"
    rdzv.mkdir()
    procs = []
    for rank in range(world):
        rank_env = {**os.environ, **(env or {}), "RANK": str(rank), "WORLD_SIZE": str(world), "DRILL_DIST_INIT": f"file://{rdzv}/store"}
        procs.append(subprocess.Popen([sys.executable, "-m", "drill", "run", *args], env=rank_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return results


def _data_files(ckpt: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in ckpt.iterdir() if p.name.endswith(".distcp")}


@pytest.mark.parametrize("world", [2, 3])
def test_a_4_rank_checkpoint_drilled_by_fewer_ranks_reads_every_byte_once(sharded_run: Path, tmp_path: Path, world: int) -> None:
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    ranks = launch(world, ["--root", str(sharded_run), "--db", db, "--json", "-q"], tmp_path)
    assert [r.returncode for r in ranks] == [0] * world, [r.stderr for r in ranks]
    assert all(r.stdout == "" for r in ranks[1:])  # only rank 0 reports
    doc = json.loads(ranks[0].stdout)
    assert doc["status"] == "passed" and doc["distributed"]["world_size"] == world
    files = _data_files(sharded_run / "step-20")
    assignment = doc["distributed"]["assignment"]
    assert sorted(f for share in assignment for f in share) == sorted(files)  # every data file, exactly once
    per_rank = [sum(files[f] for f in share) for share in assignment]
    assert [r["rank"] for r in doc["distributed"]["ranks"]] == list(range(world))  # every rank reported
    checks = {c["name"]: c for c in doc["checks"]}
    read = {f["path"]: f for f in checks["files"]["evidence"]["files"]}
    assert sorted(read) == sorted([*files, ".metadata"])  # one entry per file: nothing read twice
    assert all(read[f]["bytes_read"] == files[f] for f in files)
    assert checks["integrity"]["evidence"]["bytes_verified"] == checks["integrity"]["evidence"]["bytes_listed"]
    assert checks["contract"]["status"] == "passed" and checks["contract"]["evidence"]["ranks"] == [0, 1, 2, 3]
    if world == 2:
        assert doc["distributed"]["balance"] <= 1.1 and max(per_rank) / min(per_rank) <= 1.1
    (recorded,) = history(db=db)
    assert get_drill(recorded.id, db=db).distributed["world_size"] == world  # type: ignore[index]


def test_a_corrupt_shard_fails_the_distributed_drill_and_is_recorded_once(sharded_run: Path, tmp_path: Path) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(sharded_run, run)
    shard = run / "step-20" / "__2_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10
    shard.write_bytes(bytes(data))
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    ranks = launch(2, ["--root", str(run), "--db", db, "-q", "--no-replay"], tmp_path)
    assert [r.returncode for r in ranks] == [1, 1]  # every rank exits with the verdict
    assert "__2_0.distcp" in ranks[0].stdout and "drill: rank 1: failed:" in ranks[1].stderr
    (recorded,) = history(db=db)
    assert recorded.status == "failed"


def test_a_killed_rank_fails_the_drill_naming_it(sharded_run: Path, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    ranks = launch(2, ["--root", str(sharded_run), "--db", db, "-q", "--rank-timeout", "30"], tmp_path, env={"DRILL_FAILPOINTS": "restored@1=kill"})
    assert ranks[1].returncode == -9 and ranks[0].returncode == 5
    assert "drill: error: rank(s) 1 did not reach 'restored'" in ranks[0].stderr
    (recorded,) = history(db=db)
    assert recorded.status == "error" and "rank(s) 1" in (recorded.message or "")


def test_a_hung_rank_fails_the_drill_within_the_rank_timeout(sharded_run: Path, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    started = time.monotonic()
    ranks = launch(2, ["--root", str(sharded_run), "--db", db, "-q", "--rank-timeout", "8", "--timeout", "40"], tmp_path, env={"DRILL_FAILPOINTS": "restored@1=hang"})
    assert ranks[0].returncode == 5 and "rank(s) 1 did not reach 'restored' within 8 s" in ranks[0].stderr
    assert ranks[1].returncode == 5  # its own deadline ends the hung rank
    assert time.monotonic() - started < 90
    assert history(db=db)[0].status == "error"


def test_the_contract_wants_rng_and_loader_state_from_every_saved_rank() -> None:
    import torch

    layout = Layout(format="dcp", required=(), saved_ranks=[0, 1, 2, 3])
    rng = {f"rng.rank_{r}.{g}": torch.zeros(2) for r in (0, 1, 3) for g in ("python.state", "numpy.keys", "torch")}
    findings, evidence = check_rng(rng, layout)
    assert [(f.code, f.subject) for f in findings] == [("rng-rank-missing", "rng.rank_2")] and evidence["ranks"] == {0: ["numpy", "python", "torch CPU"], 1: ["numpy", "python", "torch CPU"], 3: ["numpy", "python", "torch CPU"]}
    loader = {f"dataloader.rank_{r}.{k}": v for r in (0, 1) for k, v in (("seed", 1), ("epoch", 0), ("position", 20), ("batch_size", 2), ("num_windows", 100))}
    findings, _ = check_dataloader({**loader, "train_state.step": 10}, layout, required=True)
    assert sorted(f.subject for f in findings if f.code == "dataloader-rank-missing") == ["dataloader.rank_2", "dataloader.rank_3"]
    findings, _ = check_dataloader({**loader, "train_state.step": 11}, layout, required=True)
    assert sorted(f.subject for f in findings if f.code == "dataloader-step-mismatch") == ["dataloader.rank_0", "dataloader.rank_1"]
