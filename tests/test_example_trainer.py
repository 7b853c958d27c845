"""examples/my_trainer: a trainer written against drill's public names only, drilled end to end —
trained in its own process, restored, checked and replayed bit for bit, with the replay
entrypoint named as a file (no PYTHONPATH)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import drill.sdk
from tests.conftest import invoke

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "my_trainer"
REPLAY = f"{EXAMPLE / 'replay.py'}:build_replay"


@pytest.fixture(scope="module")
def my_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("example") / "run"
    subprocess.run(
        [sys.executable, str(EXAMPLE / "trainer.py"), str(run), "--steps", "30", "--save-every", "10"],
        check=True,
        capture_output=True,
        cwd=run.parent,
    )
    return run


def test_the_example_uses_only_public_drill_names() -> None:
    for path in EXAMPLE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("drill"):
                assert node.module == "drill.sdk", f"{path.name} imports {node.module}"
                assert {a.name for a in node.names} <= set(drill.sdk.__all__), f"{path.name}: not in drill.sdk.__all__"
            if isinstance(node, ast.Import):
                assert all(a.name in ("drill.sdk",) or not a.name.startswith("drill") for a in node.names)


@pytest.mark.slow
def test_the_example_replays_bit_for_bit(my_run: Path, sqlite_url: str, cli: CliRunner) -> None:
    result = invoke(
        cli, "run", "--root", str(my_run), "--checkpoint", "step:20", "--replay", REPLAY, "--db", sqlite_url, "--json"
    )
    assert result.exit_code == 0, result.stdout
    doc = json.loads(result.stdout)
    assert doc["replay"]["verdict"] == "passed" and len(doc["replay"]["steps"]) == 5
    assert all(s["matches"] for s in doc["replay"]["steps"])
    assert doc["evidence_level"] == "sealed"  # drill.sdk.save sealed it as it was written
    keys = next(c for c in doc["checks"] if c["name"] == "keys")
    assert keys["status"] == "passed" and not keys["findings"]


@pytest.mark.slow
def test_a_run_that_resumed_on_other_data_is_caught(
    my_run: Path, sqlite_url: str, cli: CliRunner, tmp_path: Path
) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(my_run, run)
    log = run / drill.sdk.STEP_LOG
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    for line in lines:
        if line["step"] == 22:
            line["batch"] = "0" * 16  # the original run drew another batch at step 22
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = invoke(
        cli, "run", "--root", str(run), "--checkpoint", "step:20", "--replay", REPLAY, "--db", sqlite_url, "--json"
    )
    assert result.exit_code == 1
    codes = [f["code"] for c in json.loads(result.stdout)["checks"] for f in c["findings"]]
    assert "replay-diverged-data" in codes


def test_a_relative_entrypoint_file_in_a_policy_is_read_against_the_policy() -> None:
    from drill.policy.load import parse_policy

    policy_file = EXAMPLE / "policy.yaml"  # names ./replay.py, relative to itself
    policy = parse_policy(policy_file.read_text(), str(policy_file))
    assert policy.replay.entrypoint == REPLAY
    assert policy.checkpoints.root == str(EXAMPLE.parent.parent / "my-run")


@pytest.mark.slow
def test_a_file_entrypoint_the_run_names_inside_itself_is_refused(
    my_run: Path, sqlite_url: str, cli: CliRunner, tmp_path: Path
) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(my_run, run)
    marker = tmp_path / "ran"
    (run / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\ndef build(**kw): pass\n")
    (run / "run.json").write_text(json.dumps({"device": "cpu", "replay": "evil.py:build"}))
    result = invoke(cli, "run", "--root", str(run), "--checkpoint", "step:20", "--db", sqlite_url, "--json")
    codes = [f["code"] for c in json.loads(result.stdout)["checks"] for f in c["findings"]]
    assert result.exit_code == 1 and "replay-entrypoint-refused" in codes
    assert not marker.exists()


RESUMED_RUN = """
import json, sys, warnings
from pathlib import Path
sys.path.insert(0, sys.argv[3])
import torch
import drill.sdk
from trainer import THREADS, Training

run, mode = Path(sys.argv[1]), sys.argv[2]
torch.set_num_threads(THREADS)
torch.use_deterministic_algorithms(True)
run.mkdir(parents=True)
(run / "run.json").write_text(json.dumps({"device": "cpu"}))

def train(t, log, until, saves):
    while t.train_state.step < until:
        r = t.step()
        log.append(r.step, loss=r.loss, grad_norm=r.grad_norm, batch=r.batch)
        if r.step in saves:
            log.sync()
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
                drill.sdk.save(t.stateful(), checkpoint_id=str(run / f"step-{r.step}"), no_dist=True)

def resume(step, bug):
    t = Training()
    drill.sdk.load(t.stateful(), str(run / f"step-{step}"), record=False)
    if bug:
        t.loader.position = 0  # the bug: its sampler restarts the epoch
    return t

with drill.sdk.StepLog(run) as log:  # the first attempt: a checkpoint at step 10, then it dies at 15
    train(Training(), log, 15, {10})
if mode == "second-restarts":  # the first resume is right; it dies at 25, the second resume is not
    with drill.sdk.StepLog(run) as log:
        train(resume(10, False), log, 25, {20})
    with drill.sdk.StepLog(run) as log:
        train(resume(20, True), log, 40, {30, 40})
else:  # the second attempt resumes from step 10: steps 11-15 are logged again
    with drill.sdk.StepLog(run) as log:
        train(resume(10, mode == "restart"), log, 30, {20, 30})
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "checkpoint", "diverged_at"),
    [("continue", "step:20", None), ("restart", "step:20", 11), ("second-restarts", "step:30", 21)],
    ids=["continues", "restarts-the-epoch", "second-resume-restarts-the-epoch"],
)
def test_the_data_order_after_a_resume_must_continue_the_original(
    tmp_path: Path, sqlite_url: str, cli: CliRunner, mode: str, checkpoint: str, diverged_at: int | None
) -> None:
    """A run dies after its step-10 save and resumes from it, logging steps 11–15 again. Where
    the resume continues the data, step-20 passes; where the resumed sampler restarts the epoch,
    the drill of step-20 fails naming step 11 — though its own replay matches the resumed run.
    And a second resume within the run (KempnerForge#57): the first, from step 10, is right; the
    second, from step 20, restarts the epoch: step-30 fails naming step 21."""
    run = tmp_path / "run"
    subprocess.run([sys.executable, "-c", RESUMED_RUN, str(run), mode, str(EXAMPLE)],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    result = invoke(
        cli, "run", "--root", str(run), "--checkpoint", checkpoint, "--replay", REPLAY, "--db", sqlite_url, "--json"
    )
    replay = json.loads(result.stdout)["replay"]
    if diverged_at is None:
        assert result.exit_code == 0 and replay["verdict"] == "passed", replay
        return
    assert result.exit_code == 1 and replay["verdict"] == "diverged", replay
    assert replay["reason"].startswith(f"data order after a resume diverged at step {diverged_at}: batch "), replay[
        "reason"
    ]
    codes = [f["code"] for c in json.loads(result.stdout)["checks"] for f in c["findings"]]
    assert "replay-diverged-data" in codes


@pytest.mark.slow
def test_a_rank_whose_data_did_not_continue_after_a_resume_is_named(
    tmp_path: Path, sqlite_url: str, cli: CliRunner
) -> None:
    """Each rank keeps its own step log (``StepLog(run, rank=r)``: ``drill-steps.rank<r>.jsonl``).
    The run's own log continued its data after the resume; rank 1's did not, from step 12: the
    drill names the step and the rank."""
    run = tmp_path / "run"
    subprocess.run([sys.executable, "-c", RESUMED_RUN, str(run), "continue", str(EXAMPLE)],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    first = [(s, f"{s:016x}") for s in range(1, 16)]
    resumed = [(s, f"{s:016x}" if s < 12 else f"{s + 1000:016x}") for s in range(11, 31)]
    with drill.sdk.StepLog(run, rank=1) as log:
        for step, batch in first + resumed:
            log.append(step, loss=1.0 / step, batch=batch)
    assert (run / "drill-steps.rank1.jsonl").read_text().count('"rank":1') == len(first) + len(resumed)
    result = invoke(
        cli, "run", "--root", str(run), "--checkpoint", "step:20", "--replay", REPLAY, "--db", sqlite_url, "--json"
    )
    replay = json.loads(result.stdout)["replay"]
    assert result.exit_code == 1 and replay["reason"].startswith(
        f"data order after a resume diverged at step 12 on rank 1: batch {1012:016x}, where the run first saw {12:016x}"
    ), replay["reason"]
