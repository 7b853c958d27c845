"""drill.sdk.load: the trainer's own resume, verified in the same read and recorded as a drill."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

import drill.sdk
from drill.demo.config import DemoConfig
from drill.demo.train import build
from drill.errors import DatabaseError
from tests.conftest import recorded


@pytest.fixture
def run(demo_run: Path) -> Path:
    return demo_run  # a private copy already


def _objects(run: Path):
    return build(DemoConfig(**json.loads((run / "run.json").read_text())["config"]))


def _newest(run: Path) -> Path:
    return max((p for p in run.iterdir() if p.name.startswith("step-")), key=lambda p: int(p.name.split("-")[1]))


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.slow
def test_resume_through_drill_is_dcp_load_and_is_recorded(run: Path, sqlite_url: str) -> None:
    ckpt = _newest(run)
    ours, theirs = _objects(run), _objects(run)
    report = drill.sdk.load(ours.stateful(), str(ckpt), db=sqlite_url)  # the one line a trainer changes
    dcp.load(theirs.stateful(), checkpoint_id=str(ckpt), no_dist=True)
    for (name, a), (_, b) in zip(ours.model.state_dict().items(), theirs.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert ours.train_state.step == theirs.train_state.step == int(ckpt.name.split("-")[1])
    assert ours.optimizer.state_dict()["state"].keys() == theirs.optimizer.state_dict()["state"].keys()
    assert ours.dataloader.state_dict() == theirs.dataloader.state_dict()
    assert report.sealed and report.verified_files >= 2 and report.bytes_read > 0
    assert set(report.seconds) >= {"plan", "read", "load", "verify", "total"}
    assert report.record is not None and report.record.exists()  # spooled on the trainer's host
    assert drill.sdk.flush_records(sqlite_url) == 1  # delivered where (and when) the operator chooses
    (drill_record,) = recorded(sqlite_url)
    assert drill_record.trigger == "resume" and drill_record.status.value == "passed"
    assert drill_record.checkpoint is not None and drill_record.checkpoint.name == ckpt.name
    assert drill_record.timings.restore is not None and drill_record.timings.read is not None


@pytest.mark.slow
def test_flipped_byte_raises_naming_the_file_and_byte_range_and_falls_back(run: Path, sqlite_url: str) -> None:
    ckpt = _newest(run)
    shard = ckpt / "__0_0.distcp"
    _flip(shard, shard.stat().st_size // 2)
    with pytest.raises(drill.sdk.CheckpointCorrupt) as caught:
        drill.sdk.load(_objects(run).stateful(), str(ckpt), db=sqlite_url)
    exc = caught.value
    assert exc.file == "__0_0.distcp"
    assert exc.byte_ranges and exc.byte_ranges[0][0] <= shard.stat().st_size // 2 < exc.byte_ranges[0][1]
    assert "differs from what was sealed" in str(exc)
    fallback = drill.sdk.last_good(str(run), before=str(ckpt), db=sqlite_url)
    assert fallback is not None and Path(fallback).name != ckpt.name
    drill.sdk.load(_objects(run).stateful(), fallback, db=sqlite_url)
    assert drill.sdk.flush_records(sqlite_url) == 2
    statuses = [d.status.value for d in recorded(sqlite_url)]
    assert statuses == ["failed", "passed"]


def test_entry_that_does_not_load_raises(run: Path, sqlite_url: str) -> None:
    """An unsealed, truncated checkpoint: no seal to name the bytes; DCP's structural proof (the
    one ``drill run`` gives) names the file, and the load the entries it lost."""
    ckpt = _newest(run)
    (ckpt / "drill-manifest.json").unlink()
    shard = ckpt / "__0_0.distcp"
    os.truncate(shard, shard.stat().st_size // 2)
    with pytest.raises(drill.sdk.CheckpointCorrupt) as caught:
        drill.sdk.load(_objects(run).stateful(), str(ckpt), record=False)
    found = caught.value.findings
    assert found[0].check == "integrity" and found[0].subject == "__0_0.distcp" and caught.value.file == "__0_0.distcp"
    assert any(f.check in {"load", "files"} for f in found)


def test_database_away_never_fails_the_resume_and_the_record_is_spooled(run: Path, private_spool: Path) -> None:
    db = "postgresql://drill@127.0.0.1:9/nowhere?connect_timeout=2"
    report = drill.sdk.load(_objects(run).stateful(), str(_newest(run)), db=db)
    spooled = list(private_spool.rglob("*.json"))
    assert spooled == [report.record] and json.loads(spooled[0].read_text())["trigger"] == "resume"
    with pytest.raises(DatabaseError):
        drill.sdk.flush_records(db)
    assert list(private_spool.rglob("*.json")) == spooled  # still there for the next delivery


@pytest.mark.slow
def test_no_database_layer_on_the_trainers_host(run: Path, sqlite_url: str) -> None:
    """Recording a resume imports no database driver, ORM or migration tool into the trainer:
    the record is a spooled file, delivered by the next drill, the scheduler or flush_records."""
    code = (
        "import sys, drill.sdk, torch.distributed.checkpoint\n"
        "from tests.test_sdk_resume import _objects, _newest\n"
        "from pathlib import Path\n"
        "before = set(sys.modules)\n"
        f"report = drill.sdk.load(_objects(Path({str(run)!r})).stateful(), str(_newest(Path({str(run)!r}))), db={sqlite_url!r})\n"
        "assert report.record is not None\n"
        "heavy = sorted(m for m in set(sys.modules) - before if m.split('.')[0] in ('sqlalchemy', 'alembic', 'psycopg') or m.startswith('drill.records.db'))\n"
        "print(heavy)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert drill.sdk.flush_records(sqlite_url) == 1 and recorded(sqlite_url)[0].trigger == "resume"


def _two_ranks(ckpt: Path, db: str) -> list[dict]:
    with tempfile.TemporaryDirectory() as rdzv:
        procs, outs = [], []
        for rank in range(2):
            out = Path(rdzv) / f"rank{rank}.json"
            env = {
                **os.environ,
                "RANK": str(rank),
                "WORLD_SIZE": "2",
                "DRILL_DIST_INIT": f"file://{rdzv}/s",
                "DRILL_DB": db,
            }
            procs.append(subprocess.Popen([sys.executable, "-m", "tests.support.sdk_ranks", str(ckpt), str(out)], env=env, cwd=Path(__file__).resolve().parent.parent,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT))  # fmt: skip
            outs.append(out)
        logs = [p.communicate(timeout=300)[0].decode(errors="replace") for p in procs]
        assert all(p.returncode == 0 for p in procs), logs[0][-3000:] + logs[1][-3000:]
        return [json.loads(o.read_text()) for o in outs]


@pytest.mark.slow
def test_two_ranks_reshard_a_one_rank_checkpoint_and_agree_on_damage(run: Path, sqlite_url: str) -> None:
    ckpt = _newest(run)
    clean = _two_ranks(ckpt, sqlite_url)
    assert all(r["ok"] and r["same_as_dcp_load"] and r["ranks"] == 2 for r in clean), clean
    _flip(ckpt / "__0_0.distcp", (ckpt / "__0_0.distcp").stat().st_size // 3)
    damaged = _two_ranks(ckpt, sqlite_url)
    assert [r["ok"] for r in damaged] == [False, False], damaged  # every rank raises, none trains on
    assert all(r["file"] == "__0_0.distcp" for r in damaged)
    assert drill.sdk.flush_records(sqlite_url) == 2  # one record per resume: rank 0's
    records = recorded(sqlite_url)
    assert [d.trigger for d in records] == ["resume", "resume"] and records[-1].status.value == "failed"


@pytest.mark.slow
def test_hf_trainer_resumes_from_a_verified_checkpoint(tmp_path: Path, sqlite_url: str) -> None:
    """Hugging Face's Trainer loads its checkpoints by itself: drill.sdk.verified proves the
    bytes first, and the resume is on the record."""
    pytest.importorskip("transformers", reason="transformers is not installed: no real HF Trainer checkpoint")
    from tests.support import frameworks

    out = frameworks.hf_trainer_run(tmp_path / "hf")
    ckpt = out / "checkpoint-4"
    drill.sdk.seal(str(ckpt))
    assert drill.sdk.verified(str(ckpt), db=sqlite_url) == str(ckpt)
    drill.sdk.flush_records(sqlite_url)
    (record,) = recorded(sqlite_url)
    assert (record.trigger, record.status.value, record.checkpoint.format) == ("resume", "passed", "hf-trainer")
    _flip(ckpt / "model.safetensors", (ckpt / "model.safetensors").stat().st_size - 10)
    with pytest.raises(drill.sdk.CheckpointCorrupt) as caught:
        drill.sdk.verified(str(ckpt), db=sqlite_url)
    assert caught.value.file == "model.safetensors"
    assert frameworks.hf_trainer_resume(out, drill.sdk.verified(str(out / "checkpoint-2"), db=sqlite_url)) == 6


def test_a_load_collects_no_cycles_meanwhile(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A load of thousands of files makes tens of thousands of small objects (the index, DCP's
    plan, the proof): Python's cyclic collector is paused for the whole load — each collection
    would walk all the trainer and torch hold — and enabled again after."""
    import gc

    ckpt = _newest(run)
    seen: list[bool] = []
    objects = _objects(run)
    state = objects.stateful()
    real = type(state["train_state"]).load_state_dict

    def spied(self: object, sd: dict) -> None:
        seen.append(gc.isenabled())
        real(self, sd)

    monkeypatch.setattr(type(state["train_state"]), "load_state_dict", spied)
    assert gc.isenabled()
    report = drill.sdk.load(state, str(ckpt), record=False)
    assert report.sealed and report.verified_files >= 2
    assert seen == [False] and gc.isenabled()
