"""Sealed at save (drill.sdk.save / async_save, SealingWriter): every rank hashes the bytes it
writes, the coordinator writes the manifest before it commits `.metadata`, nothing is read back.
Checkpoints written by real DCP saves, on 1 and 2 ranks (the 2-rank ones by the sharded demo,
which saves through drill.sdk.save)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from drill.sdk import async_save, save, seal

KEY = b"k" * 32


def _state(seed: int = 0) -> dict:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 256)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "train_state": {"step": 10}}


def _files(manifest: Path) -> list[dict]:
    return json.loads(manifest.read_text())["files"]


def _verify(ckpt: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "drill", "verify", str(ckpt), *args], capture_output=True, text=True)


def test_a_sealed_save_has_the_digests_drill_seal_would_write_and_reads_nothing_back(tmp_path: Path) -> None:
    ckpt = tmp_path / "run" / "step-10"
    report = save(_state(), ckpt, no_dist=True, thread_count=2)
    names = sorted(p.name for p in ckpt.iterdir())
    assert names == [".metadata", "__0_0.distcp", "__0_1.distcp", "drill-manifest.json"]
    assert report.files == 3 and report.bytes == sum(
        (ckpt / n).stat().st_size for n in names if n != "drill-manifest.json"
    )
    assert (
        report.bytes_read_back == 0 and report.hash_seconds > 0 and report.manifest == str(ckpt / "drill-manifest.json")
    )
    twin = tmp_path / "twin" / "step-10"
    shutil.copytree(ckpt, twin)
    (twin / "drill-manifest.json").unlink()
    seal(twin)  # one read of every byte: what the writer saved the reading of
    assert _files(ckpt / "drill-manifest.json") == _files(twin / "drill-manifest.json")
    res = _verify(ckpt)
    assert res.returncode == 0 and "sealed, unauthenticated: every byte matches the manifest (3 files" in res.stdout, (
        res.stdout + res.stderr
    )


def test_a_byte_flipped_after_the_save_is_caught(tmp_path: Path) -> None:
    ckpt = tmp_path / "step-10"
    save(_state(), ckpt, no_dist=True)
    shard = ckpt / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x04
    shard.write_bytes(bytes(data))
    res = _verify(ckpt)
    assert res.returncode == 1 and "digest-mismatch [__0_0.distcp]" in res.stdout


def test_the_keyed_seal_authenticates_and_another_key_does_not(tmp_path: Path) -> None:
    ckpt = tmp_path / "step-10"
    save(_state(), ckpt, key=KEY, no_dist=True)
    good, bad = tmp_path / "good.key", tmp_path / "bad.key"
    good.write_bytes(KEY)
    bad.write_bytes(b"x" * 32)
    res = _verify(ckpt, "--key-file", str(good))
    assert (
        res.returncode == 0 and "sealed and authenticated" in res.stdout and "evidence: authenticated" in res.stdout
    ), res.stdout + res.stderr
    res = _verify(ckpt, "--key-file", str(bad))
    assert res.returncode == 1 and "sealed with another key" in res.stdout


def test_async_save_seals_in_the_background(tmp_path: Path) -> None:
    ckpt = tmp_path / "step-10"
    future = async_save(_state(), ckpt, no_dist=True)
    future.result()
    assert (ckpt / "drill-manifest.json").exists() and (ckpt / ".metadata").exists()
    assert _verify(ckpt).returncode == 0


@pytest.mark.slow
def test_a_save_killed_mid_write_leaves_neither_manifest_nor_metadata(tmp_path: Path) -> None:
    ckpt = tmp_path / "step-10"
    code = f"import torch; from drill.sdk import save; from tests.test_sealed_save import _state; save(_state(), {str(ckpt)!r}, no_dist=True, thread_count=2)"
    res = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "DRILL_FAILPOINTS": "sealed-file=kill"},
        capture_output=True,
        text=True,
    )
    assert res.returncode == -9, res.stderr
    names = {p.name for p in ckpt.iterdir()}
    assert names and not names & {"drill-manifest.json", ".metadata"}  # a data file or two, never sealed or committed


@pytest.mark.slow
def test_the_sharded_demo_saves_sealed_on_every_rank_and_loads_on_one_and_two(tmp_path: Path) -> None:
    """The 2-rank demo saves through drill.sdk.save: the seal covers both ranks' shards; one
    process restores it (drill run), and two ranks do (distributed drill)."""
    from drill import history
    from tests.support.ranks import launch

    run = tmp_path / "run"
    subprocess.run(
        [sys.executable, "-m", "drill", "demo", str(run), "--ranks", "2", "--steps", "10", "--save-every", "5"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    ckpt = run / "step-10"
    listed = {f["path"] for f in _files(ckpt / "drill-manifest.json")}
    assert listed == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    db = f"sqlite:///{tmp_path / 'one.db'}"
    res = subprocess.run(
        [sys.executable, "-m", "drill", "run", "--root", str(run), "--db", db, "--json", "-q", "--no-replay"],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert (
        doc["evidence_level"] == "sealed" and {c["name"]: c for c in doc["checks"]}["integrity"]["status"] == "passed"
    )
    db2 = f"sqlite:///{tmp_path / 'two.db'}"
    ranks = launch(2, ["--root", str(run), "--db", db2, "-q", "--no-replay"], tmp_path)
    assert [r.returncode for r in ranks] == [0, 0], ranks[0].stderr
    (recorded,) = history(db=db2)
    assert recorded.status == "passed" and recorded.evidence_level == "sealed"


@pytest.mark.parametrize("threads", [1, 4])
def test_every_writer_thread_count_seals_the_same_bytes_drill_seal_reads(tmp_path: Path, threads: int) -> None:
    ckpt = tmp_path / "a" / "step-3"
    save(_state(threads), ckpt, no_dist=True, thread_count=threads, sync_files=False)
    twin = tmp_path / "b" / "step-3"
    shutil.copytree(ckpt, twin)
    (twin / "drill-manifest.json").unlink()
    seal(twin)
    assert _files(ckpt / "drill-manifest.json") == _files(twin / "drill-manifest.json")


@pytest.mark.slow
def test_the_trainer_callback_seals_every_checkpoint_as_it_is_saved(tmp_path: Path) -> None:
    """transformers' own Trainer, with DrillSealCallback: each checkpoint-N is sealed (keyed)
    right after the save; drill run proves every byte, and a flipped byte is caught."""
    pytest.importorskip("transformers")
    from drill import history
    from drill.integrations.hf import DrillSealCallback
    from tests.support.frameworks import hf_trainer_run

    callback = DrillSealCallback(key=KEY)
    run = hf_trainer_run(tmp_path / "run", callbacks=[callback])
    assert [r.files > 0 and r.manifest for r in callback.reports] == [
        str(run / f"checkpoint-{s}" / "drill-manifest.json") for s in (2, 4)
    ]
    key = tmp_path / "seal.key"
    key.write_bytes(KEY)
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "drill",
            "run",
            "--root",
            str(run),
            "--db",
            db,
            "-q",
            "--no-replay",
            "--key-file",
            str(key),
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr
    assert json.loads(res.stdout)["evidence_level"] == "authenticated"
    weights = run / "checkpoint-4" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0x01
    weights.write_bytes(bytes(data))
    res = _verify(run / "checkpoint-4", "--key-file", str(key))
    assert res.returncode == 1 and "digest-mismatch [model.safetensors]" in res.stdout
    assert history(db=db)[0].status == "passed"


def test_a_sealed_save_is_recorded_and_the_report_shows_what_the_seal_cost(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from drill.records.db import open_database
    from drill.records.store import Records
    from tests.conftest import invoke

    db = f"sqlite:///{tmp_path / 'drill.db'}"
    ckpt = tmp_path / "run" / "step-10"
    report = save(_state(), ckpt, key=KEY, no_dist=True, db=db)
    assert report.record is not None and report.record.exists()  # spooled on the trainer's host
    from drill.sdk import flush_records

    assert flush_records(db) == 1
    database = open_database(db)
    (row,) = Records(database).saves()
    database.close()
    assert (
        row["checkpoint"],
        row["step"],
        row["method"],
        row["files"],
        row["bytes"],
        row["keyed"],
        row["bytes_read_back"],
    ) == (str(ckpt), 10, "writer", report.files, report.bytes, True, 0) and report.files >= 2
    res = invoke(CliRunner(), "report", "--db", db, "--root", str(tmp_path / "run"), "-f", "md")
    assert res.exit_code == 0, res.stderr
    assert "| sealed at save |" in res.stdout and "yes (hashing " in res.stdout and ", keyed)" in res.stdout


def test_a_save_whose_database_is_away_is_spooled_and_delivered_later_never_failing_the_save(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from drill.records.db import open_database
    from drill.records.store import Records
    from tests.conftest import invoke

    away = tmp_path / "not-yet"
    db = f"sqlite:///{away / 'drill.db'}"
    report = save(_state(), tmp_path / "run" / "step-10", no_dist=True, db=db)  # the save itself never notices
    assert report.record is not None
    assert (tmp_path / "run" / "step-10" / "drill-manifest.json").exists()
    away.mkdir()
    res = invoke(CliRunner(), "db", "flush", "--db", db)
    assert res.exit_code == 0, res.stderr
    database = open_database(db)
    assert [s["method"] for s in Records(database).saves()] == ["writer"]
    database.close()
    res = invoke(CliRunner(), "db", "flush", "--db", db)  # delivered once
    database = open_database(db)
    assert len(Records(database).saves()) == 1
    database.close()


@pytest.mark.slow
def test_lightning_fsdp_checkpoints_are_sealed_after_the_strategy_saves_them(tmp_path: Path) -> None:
    """Lightning's own FSDP strategy on 2 CPU ranks, with SealAfterSave mixed in: each sharded
    *.ckpt/ directory (DCP shards and meta.pt) is sealed; drill verify proves every byte."""
    pytest.importorskip("lightning")
    from tests.support import lightning_fsdp

    checkpoints = lightning_fsdp.spawn(tmp_path / "pl", ranks=2, seal=True)
    dirs = sorted(p for p in checkpoints.iterdir() if p.is_dir())
    assert dirs
    for ckpt in dirs:
        listed = {f["path"] for f in _files(ckpt / "drill-manifest.json")}
        assert "meta.pt" in listed and ".metadata" in listed and any(p.endswith(".distcp") for p in listed)
        res = _verify(ckpt)
        assert res.returncode == 0 and "sealed, unauthenticated: every byte matches" in res.stdout, (
            res.stdout + res.stderr
        )


@pytest.mark.slow
def test_recording_a_save_imports_no_database_layer_into_the_trainer(tmp_path: Path) -> None:
    """As a resume's: the save's record is a spooled file; no SQLAlchemy, Alembic or driver
    is imported on the trainer's host to write it."""
    code = (
        "import sys, torch, drill.sdk\n"
        "before = set(sys.modules)\n"
        f"report = drill.sdk.save({{'w': torch.ones(4)}}, {str(tmp_path / 'run' / 'step-1')!r}, no_dist=True, db={'sqlite:///' + str(tmp_path / 'd.db')!r})\n"
        "assert report.record is not None\n"
        "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in ('sqlalchemy', 'alembic', 'psycopg')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
