"""Deterministic replay on real demo checkpoints: bitwise when right, each fault its verdict."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from drill import DrillOutcome, get_drill
from drill.demo.state import RNGState
from drill.replay import ReplaySpec, Tolerance, compare_steps, load_reference
from drill.replay.compare import CROSS_DEVICE, SAME_DEVICE
from drill.sdk import StepRecord
from tests.conftest import drill
from tests.test_formats import rewrite_dcp


def _drill(run: Path, db: str, **replay: Any) -> tuple[DrillOutcome, dict[str, Any]]:
    """The drill, and its record as ``drill show --json`` prints it."""
    outcome = drill(run, db, replay=ReplaySpec(**replay))
    record = get_drill(outcome.id, db=db).to_document()
    assert record.pop("seal")["state"] == "intact"  # read back: checked against its audit seal
    assert record == outcome.to_document()  # what was run is what was recorded
    return outcome, record


def _replay(outcome: DrillOutcome):
    return next(c for c in outcome.checks if c.name == "replay")


@pytest.mark.slow
def test_clean_checkpoint_replays_bit_for_bit(demo_run: Path, sqlite_url: str) -> None:
    outcome, record = _drill(demo_run, sqlite_url)
    assert outcome.status == "passed"
    check = _replay(outcome)
    assert "5 steps after step 30 match the original run bit for bit: data order, loss and grad norm" in check.summary
    assert record["replay"]["verdict"] == "passed"
    steps = record["replay"]["steps"]
    assert [s["step"] for s in steps] == [31, 32, 33, 34, 35]
    assert all(s["matches"] and s["loss"] == s["reference_loss"] and s["batch"] == s["reference_batch"] for s in steps)
    # time to first step is recorded apart from restore latency, and is the larger
    assert record["timings"]["ttfs"] > record["timings"]["restore"] > 0


@pytest.mark.slow
def test_dataloader_rewound_diverges_on_data_at_the_first_step(demo_run: Path, sqlite_url: str) -> None:
    def rewind(s: dict[str, Any]) -> None:
        s["dataloader.position"] -= s["dataloader.batch_size"]

    rewrite_dcp(demo_run / "step-30", rewind)
    outcome, record = _drill(demo_run, sqlite_url)
    assert outcome.status == "failed" and record["replay"]["verdict"] == "diverged"
    (finding,) = _replay(outcome).findings
    assert finding.code == "replay-diverged-data" and finding.subject == "step 31"


@pytest.mark.slow
def test_rng_from_another_seed_diverges_on_loss(demo_run: Path, sqlite_url: str) -> None:
    torch.manual_seed(4321)
    other = RNGState().state_dict()["torch"]

    def reseed(s: dict[str, Any]) -> None:
        s["rng.torch"] = other

    rewrite_dcp(demo_run / "step-30", reseed)
    outcome, _ = _drill(demo_run, sqlite_url)
    (finding,) = _replay(outcome).findings
    assert finding.code == "replay-diverged-loss" and finding.subject == "step 31"  # same data, other dropout


@pytest.mark.slow
def test_nudged_weight_passes_hashes_and_diverges_on_loss(demo_run: Path, sqlite_url: str) -> None:
    def nudge(s: dict[str, Any]) -> None:
        s["model.head.weight"] = s["model.head.weight"].clone()
        s["model.head.weight"][0, 0] += 1e-3

    rewrite_dcp(demo_run / "step-30", nudge)  # re-sealed: the bytes match their manifest
    outcome, _ = _drill(demo_run, sqlite_url)
    statuses = {c.name: c.status.value for c in outcome.checks}
    assert statuses["integrity"] == statuses["contract"] == "passed"
    (finding,) = _replay(outcome).findings
    assert finding.code == "replay-diverged-loss" and "relative" in finding.message


def test_reference_log_missing_is_not_replayable(demo_run: Path, sqlite_url: str) -> None:
    os.remove(demo_run / "drill-steps.jsonl")
    outcome, record = _drill(demo_run, sqlite_url)
    check = _replay(outcome)
    assert check.status.value == "skipped" and "gap in the evidence, not a pass" in check.summary
    assert record["replay"]["verdict"] == "not replayable" and record["timings"]["ttfs"] is None


def test_no_entrypoint_is_not_replayable(demo_run: Path, sqlite_url: str) -> None:
    doc = json.loads((demo_run / "run.json").read_text())
    del doc["replay"]
    (demo_run / "run.json").write_text(json.dumps(doc))
    outcome, _ = _drill(demo_run, sqlite_url)
    assert "no replay entrypoint" in _replay(outcome).summary


@pytest.mark.slow
def test_step_function_that_raises_is_an_error_with_its_traceback(demo_run: Path, sqlite_url: str) -> None:
    outcome, record = _drill(demo_run, sqlite_url, entrypoint="tests.support.replay_targets:raising")
    assert outcome.status == "error" and record["replay"]["verdict"] == "error"
    assert "the step function exploded" in outcome.message
    assert "Traceback" in record["error"] and "replay_targets.py" in record["error"]


@pytest.mark.slow
def test_hanging_replay_is_killed_at_its_timeout(demo_run: Path, sqlite_url: str) -> None:
    outcome, record = _drill(demo_run, sqlite_url, entrypoint="tests.support.replay_targets:hanging", timeout=8)
    assert outcome.status == "error" and "timed out after 8 s" in outcome.message and "0 of 5 steps" in outcome.message
    assert record["replay"]["verdict"] == "error"


def test_compare_is_exact_on_the_same_device() -> None:
    ref = {1: StepRecord(step=1, loss=2.0, grad_norm=1.0, batch="a"), 2: StepRecord(step=2, loss=1.5, batch="b")}
    assert compare_steps(ref, [StepRecord(step=1, loss=2.0, grad_norm=1.0, batch="a")], SAME_DEVICE) is None
    d = compare_steps(
        ref, [StepRecord(step=1, loss=2.0, batch="a"), StepRecord(step=2, loss=1.5000001, batch="b")], SAME_DEVICE
    )
    assert d is not None and (d.step, d.what) == (2, "loss")
    assert compare_steps(ref, [StepRecord(step=1, loss=2.0000001, batch="a")], CROSS_DEVICE) is None
    d = compare_steps(ref, [StepRecord(step=1, loss=2.0, grad_norm=1.1, batch="a")], Tolerance(0.01, 0))
    assert d is not None and d.what == "grad_norm"
    assert compare_steps(ref, [StepRecord(step=1, loss=9.0, batch="z")], CROSS_DEVICE).what == "data"


# -- importers: third-party runs replay from what their frameworks already log --------------
@pytest.mark.slow
def test_reference_from_hf_log_history(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="transformers is not installed")
    from tests.support.frameworks import hf_trainer_run

    ref = load_reference(hf_trainer_run(tmp_path / "hf"))
    assert ref is not None and "log_history" in ref.source
    assert sorted(ref.steps) == [1, 2, 3, 4] and not any(r.batch for r in ref.steps.values())
    assert all(r.grad_norm is not None for r in ref.steps.values())


def test_reference_from_lightning_csv(tmp_path: Path) -> None:
    run = tmp_path / "pl" / "version_0"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text("epoch,step,train_loss\n0,0,1.5\n0,1,1.25\n0,2,1.125\n")
    ref = load_reference(tmp_path / "pl")
    assert ref is not None and ref.source.endswith("(train_loss)")
    assert {s: r.loss for s, r in ref.steps.items()} == {1: 1.5, 2: 1.25, 3: 1.125}


@pytest.mark.timeout(60)
def test_a_lightning_csv_that_is_a_fifo_or_holds_no_numbers_is_no_reference(tmp_path: Path) -> None:
    """The run's ``metrics.csv`` is read one way (``read_regular``): a FIFO under its name blocked
    the drill forever; a step of ``inf`` was an ``OverflowError``. Both are skipped: the next
    source (or none) is the reference."""
    run = tmp_path / "pl"
    (run / "version_0").mkdir(parents=True)
    os.mkfifo(run / "version_0" / "metrics.csv")
    (run / "version_1").mkdir()
    (run / "version_1" / "metrics.csv").write_text("step,train_loss\ninf,1.5\nnan,1.0\n1,x\n2,1.25\n")
    ref = load_reference(run)
    assert ref is not None and {s: r.loss for s, r in ref.steps.items()} == {3: 1.25}


def test_reference_from_tensorboard(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="tensorboard is not installed")
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "tb"))
    for step, loss in enumerate([3.0, 2.5, 2.25], start=1):
        writer.add_scalar("train/loss", loss, step)
    writer.close()
    ref = load_reference(tmp_path / "tb")
    assert ref is not None and {s: r.loss for s, r in ref.steps.items()} == {1: 3.0, 2: 2.5, 3: 2.25}


@pytest.mark.slow
def test_cli_shows_ttfs_and_takes_replay_options(demo_run: Path, sqlite_url: str) -> None:
    from typer.testing import CliRunner

    from tests.conftest import invoke

    res = invoke(CliRunner(), "run", "--root", str(demo_run), "--replay-steps", "2", "--json", "--db", sqlite_url)
    doc = json.loads(res.stdout)
    assert res.exit_code == 0 and doc["timings"]["ttfs"] > 0
    assert "2 steps after step 30" in next(c for c in doc["checks"] if c["name"] == "replay")["summary"]
    bad = invoke(CliRunner(), "run", "--root", str(demo_run), "--replay", "nocolon", "--db", sqlite_url)
    assert bad.exit_code == 2 and "module:function" in bad.stderr


@pytest.mark.timeout(300)
def test_more_replay_steps_than_the_record_holds_replay_what_it_holds(demo_run: Path, sqlite_url: str) -> None:
    """``--replay-steps 99999999999`` walked a range of that many steps looking for the
    record's (a hang before the replay began): the steps compared are the record's after the
    checkpoint, and the summary says how many of those asked for."""
    from typer.testing import CliRunner

    from tests.conftest import invoke

    res = invoke(
        CliRunner(), "run", "--root", str(demo_run), "-c", "step-20", "--replay-steps", "99999999999",
        "--json", "--quiet", "--db", sqlite_url,
    )  # fmt: skip
    assert res.exit_code == 0, res.stderr
    (replay,) = [c for c in json.loads(res.stdout)["checks"] if c["name"] == "replay"]
    assert replay["status"] == "passed" and "of the 99999999999 steps asked for" in replay["summary"], replay
