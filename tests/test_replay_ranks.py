"""Replay across ranks: a checkpoint saved by N ranks is replayed by N processes in a process
group of their own (gloo on CPU), each compared with what that rank logged — and resharded, by
M ≠ N, compared with the run's global loss. Real runs: a 2-rank DDP trainer (examples/ddp) and
the FSDP2 demo sharded over 2 and 4 ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from drill.demo.config import DemoConfig
from drill.demo.distributed import train_distributed
from tests.support.ranks import launch

ROOT = Path(__file__).resolve().parent.parent
DDP = ROOT / "examples" / "ddp"

pytestmark = pytest.mark.slow

PLANTED = """
import json, os, torch
import torch.distributed as dist
from trainer import Training

class Planted(Training):
    threads = 1

    def step(self):
        if self.rank == 1 and os.environ.get("PLANT") == "rng":
            torch.rand(1)  # a rank-local RNG draw the run never made: rank 1's dropout shifts
        if self.rank == 1 and os.environ.get("PLANT") == "die" and self.train_state.step == 11:
            os._exit(3)
        return super().step()

def build_replay(*, run_dir, checkpoint, device):
    if os.environ.get("WHERE"):  # which drill rank started this replay rank (RANK is inherited)
        with open(os.path.join(os.environ["WHERE"], f"replay-rank{dist.get_rank()}"), "w") as f:
            json.dump({"drill_rank": os.environ.get("RANK"), "pid": os.getpid(), "parent": os.getppid()}, f)
    return Planted()
"""


def _train_ddp(run: Path, rdzv: Path, world: int = 2) -> None:
    env = {**os.environ, "WORLD_SIZE": str(world), "INIT_METHOD": f"file://{rdzv}", "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(DDP / "trainer.py"), str(run)],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        for r in range(world)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * world, outs


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("ddp")
    _train_ddp(base / "run", base / "rdzv")
    return base / "run"


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("fsdp2") / "run"
    train_distributed(run, DemoConfig(steps=20, save_every=10, keep=2), 2)
    return run


def _drill(run: Path, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    res = subprocess.run(
        [sys.executable, "-m", "drill", "run", "--root", str(run), "--checkpoint", "step:10",
         "--db", f"sqlite:///{tmp_path / 'drill.db'}", "--json", "-q", *args],
        capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert res.stdout, res.stderr[-3000:]
    return json.loads(res.stdout)


def _replay(doc: dict) -> tuple[dict, dict]:
    (check,) = [c for c in doc["checks"] if c["name"] == "replay"]
    return doc["replay"], check


def test_a_2_rank_ddp_run_is_replayed_by_2_ranks_bit_for_bit(ddp_run: Path, tmp_path: Path) -> None:
    """Each rank of the replay is compared with its own log (its slice, its local loss), and the
    run's global loss with the run's log: five steps, bit for bit."""
    assert sorted(p.name for p in ddp_run.glob("drill-steps*")) == [
        "drill-steps.jsonl", "drill-steps.rank0.jsonl", "drill-steps.rank1.jsonl",
    ]  # fmt: skip
    doc = _drill(ddp_run, tmp_path, "--replay", f"{DDP / 'replay.py'}:build_replay")
    replay, check = _replay(doc)
    assert doc["status"] == "passed" and replay["verdict"] == "passed", replay
    assert replay["reason"].startswith("5 steps after step 10 match the original run bit for bit: data order")
    assert "(by 2 ranks; 2 of them compared with their own logs)" in replay["reason"]
    assert (check["evidence"]["ranks"], check["evidence"]["saved_ranks"]) == (2, 2)
    assert [s["step"] for s in replay["steps"]] == [11, 12, 13, 14, 15] and all(s["matches"] for s in replay["steps"])


def test_a_rank_local_rng_draw_fails_naming_the_rank_and_step(ddp_run: Path, tmp_path: Path) -> None:
    """Rank 1 draws once from its RNG before each step, as a hidden draw in a trainer would:
    every static check passes; the replay names rank 1 and step 11 (rank 0's own log still
    matches at step 11; the run's global loss moves with rank 1)."""
    (tmp_path / "planted.py").write_text(PLANTED)
    env = {"PLANT": "rng", "PYTHONPATH": str(DDP)}
    doc = _drill(ddp_run, tmp_path, "--replay", f"{tmp_path / 'planted.py'}:build_replay", env=env)
    replay, check = _replay(doc)
    assert doc["status"] == "failed" and replay["verdict"] == "diverged", replay
    assert replay["reason"].startswith("loss diverged at step 11 on rank 1: "), replay["reason"]
    assert "that rank logged" in replay["reason"]
    (finding,) = check["findings"]
    assert finding["code"] == "replay-diverged-loss" and finding["subject"] == "step 11 on rank 1"
    statuses = {c["name"]: c["status"] for c in doc["checks"]}
    assert all(statuses[n] == "passed" for n in ("integrity", "load", "keys", "contract"))


def test_a_rank_that_dies_mid_replay_is_named_and_the_others_do_not_hang(ddp_run: Path, tmp_path: Path) -> None:
    """Rank 1's replay exits at step 11 while rank 0 waits in DDP's all-reduce for it: the
    drill is an error naming rank 1, rank 0 is killed with it, well before the replay timeout."""
    (tmp_path / "planted.py").write_text(PLANTED)
    env = {"PLANT": "die", "PYTHONPATH": str(DDP)}
    doc = _drill(
        ddp_run, tmp_path, "--replay", f"{tmp_path / 'planted.py'}:build_replay", "--replay-timeout", "600", env=env
    )
    replay, _ = _replay(doc)
    assert doc["status"] == "error" and replay["verdict"] == "error", replay
    assert replay["reason"] == "the replay process of rank 1 died (exit code 3) while replaying", replay["reason"]


def test_the_fsdp2_demo_is_replayed_by_its_2_ranks_bit_for_bit(fsdp_run: Path, tmp_path: Path) -> None:
    """The demo names its replay in run.json: nothing to pass. FSDP2 over gloo, per-rank
    data-loader and RNG state loaded by each rank of the replay."""
    doc = _drill(fsdp_run, tmp_path)
    replay, _ = _replay(doc)
    assert doc["status"] == "passed" and replay["verdict"] == "passed", replay
    assert (
        "bit for bit" in replay["reason"] and "(by 2 ranks; 2 of them compared with their own logs)" in replay["reason"]
    )


def test_the_fsdp2_run_saved_by_4_ranks_replays_on_2_within_the_resharding_tolerance(tmp_path: Path) -> None:
    """Resharded 4 → 2 (and → 1): each rank now trains twice the slice; the global loss and grad
    norm agree with the run's within rtol 1e-5 (the sums run in another order). The run has no
    dropout: randomness each rank draws for itself cannot survive a reshard."""
    run = tmp_path / "run"
    train_distributed(run, DemoConfig(steps=20, save_every=10, keep=2, dropout=0.0), 4)
    for ranks in ("2", "1"):
        doc = _drill(run, tmp_path, "--replay-ranks", ranks)
        replay, check = _replay(doc)
        assert doc["status"] == "passed" and replay["verdict"] == "passed", replay
        assert replay["reason"].startswith("5 steps after step 10 match the original run within rtol=1e-05, atol=1e-06")
        assert f"(resharded: saved by 4 ranks, replayed by {ranks}; the run's global view)" in replay["reason"]
        assert (check["evidence"]["ranks"], check["evidence"]["saved_ranks"]) == (int(ranks), 4)


def test_a_distributed_drill_runs_each_rank_of_the_replay_on_its_own_drill_rank(ddp_run: Path, tmp_path: Path) -> None:
    """Two drill ranks (srun-style), a checkpoint saved by 2: drill rank r starts replay rank r
    — on its own host, in a real job — and the replay's ranks meet in the drill's rendezvous.
    Rank 0 judges and records: every rank compared with its own log."""
    (tmp_path / "planted.py").write_text(PLANTED)
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    args = ["--root", str(ddp_run), "--checkpoint", "step:10", "--db", db, "--json", "-q",
            "--replay", f"{tmp_path / 'planted.py'}:build_replay"]  # fmt: skip
    ranks = launch(2, args, tmp_path, env={"PYTHONPATH": str(DDP), "WHERE": str(tmp_path)})
    assert [r.returncode for r in ranks] == [0, 0], [r.stderr[-2000:] for r in ranks]
    replay = json.loads(ranks[0].stdout)["replay"]
    assert replay["verdict"] == "passed" and "(by 2 ranks; 2 of them compared with their own logs)" in replay["reason"]
    started_by = {r: json.loads((tmp_path / f"replay-rank{r}").read_text())["drill_rank"] for r in (0, 1)}
    assert started_by == {0: "0", 1: "1"}


def test_in_a_distributed_drill_a_replay_rank_that_dies_is_named_by_rank_0(ddp_run: Path, tmp_path: Path) -> None:
    """Replay rank 1 (started by drill rank 1) exits at step 11: drill rank 1 tells the others
    through the drill's store, replay rank 0 — blocked in DDP's all-reduce — is stopped at once,
    and rank 0's record is an ``error`` naming rank 1 (not the stop it caused)."""
    (tmp_path / "planted.py").write_text(PLANTED)
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    args = ["--root", str(ddp_run), "--checkpoint", "step:10", "--db", db, "--json", "-q", "--replay-timeout", "600",
            "--replay", f"{tmp_path / 'planted.py'}:build_replay"]  # fmt: skip
    ranks = launch(2, args, tmp_path, env={"PYTHONPATH": str(DDP), "PLANT": "die"})
    assert [r.returncode for r in ranks] == [5, 5], [r.stderr[-2000:] for r in ranks]
    doc = json.loads(ranks[0].stdout)
    assert doc["status"] == "error" and doc["replay"]["verdict"] == "error", doc["replay"]
    assert doc["replay"]["reason"] == "the replay process of rank 1 died (exit code 3) while replaying", doc["replay"]
