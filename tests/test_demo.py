"""The demo is a genuine, restorable training run."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from typer.testing import CliRunner

from drill.demo import DemoConfig
from drill.demo.train import build, deterministic, train_step
from drill.sdk import read_step_log
from tests.conftest import SMALL_RUN, invoke


def test_run_directory_layout(pristine_run: Path) -> None:
    names = sorted(p.name for p in pristine_run.iterdir())
    assert names == ["drill-steps.jsonl", "run.json", "step-10", "step-20", "step-30"]
    for step in (10, 20, 30):
        files = {p.name for p in (pristine_run / f"step-{step}").iterdir()}
        assert ".metadata" in files and "drill-manifest.json" in files
        assert sum(name.endswith(".distcp") for name in files) == 2
    assert json.loads((pristine_run / "run.json").read_text())["config"]["steps"] == SMALL_RUN.steps


@pytest.mark.slow
def test_retention_keeps_last_l(tmp_path: Path) -> None:
    from drill.demo import train

    result = train(tmp_path / "run", DemoConfig(steps=12, save_every=2, keep=2))
    assert result.saved == [2, 4, 6, 8, 10, 12]
    assert result.retained == [10, 12]
    assert sorted(p.name for p in (tmp_path / "run").glob("step-*")) == ["step-10", "step-12"]


def test_loss_goes_down(pristine_run: Path) -> None:
    log = read_step_log(pristine_run)
    assert [r.step for r in log] == list(range(1, SMALL_RUN.steps + 1))
    first, last = statistics.mean(r.loss for r in log[:5]), statistics.mean(r.loss for r in log[-5:])
    assert last < first - 0.5, (first, last)
    assert all(r.batch and len(r.batch) == 16 for r in log)


@pytest.mark.slow
def test_restored_run_continues_bit_for_bit(pristine_run: Path) -> None:
    """Restoring step-20 into fresh objects and training on reproduces steps 21..30 exactly:
    model, optimizer, scheduler, data order and RNG are all in the checkpoint."""
    log = {r.step: r for r in read_step_log(pristine_run)}
    with deterministic(SMALL_RUN.threads):
        objs = build(SMALL_RUN)
        torch.manual_seed(999)  # scramble the RNG: the checkpoint must restore it
        state = objs.stateful()
        dcp.load(state, checkpoint_id=str(pristine_run / "step-20"), no_dist=True)
        assert objs.train_state.step == 20
        for _ in range(10):
            record = train_step(objs)
            assert record.batch == log[record.step].batch
            assert record.loss == log[record.step].loss
            assert record.grad_norm == log[record.step].grad_norm


def test_config_rejects_bad_combinations() -> None:
    with pytest.raises(ValueError, match="keep-last-0"):
        DemoConfig(keep=0)
    with pytest.raises(ValueError, match="divisible"):
        DemoConfig(n_embd=65, n_head=2)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--n-layer", "0"], "n_layer must be at least 1, not 0"),
        (["--n-embd", "0"], "n_embd must be at least 1, not 0"),  # was an internal error (exit 70)
        (["--n-embd", "-4"], "n_embd must be at least 1, not -4"),  # was an internal error (exit 70)
        (["--steps", "5"], "the run would save no checkpoint: 5 steps, a save every 20"),  # was exit 0, no checkpoint
        (["--n-layer", "99999999999"], "more than this host's"),  # was an allocation that never ended
        (["--n-embd", "100000"], "need about 3.8 TB to train"),
    ],
)
def test_a_demo_that_cannot_be_trained_or_would_save_nothing_is_a_usage_error(
    cli: CliRunner, tmp_path: Path, flags: list[str], says: str
) -> None:
    res = invoke(cli, "demo", str(tmp_path / "run"), *flags)
    assert res.exit_code == 2 and says in res.stderr, (res.exit_code, res.stderr)
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def test_a_recorded_configuration_too_large_for_this_host_is_refused_before_anything_is_allocated() -> None:
    """A run.json is the run's, read by the replay: a width it claims is checked against this
    host's memory before a tensor of that size is asked for (it was: 12 TB, "can't allocate")."""
    from drill.memory import physical_memory

    width = 1 << 20
    cfg = DemoConfig(n_layer=1, n_embd=32)
    assert cfg.training_bytes < physical_memory()
    with pytest.raises(ValueError, match="more than this host's"):
        DemoConfig(n_layer=2, n_embd=width)


def test_refuses_to_overwrite_a_run(pristine_run: Path) -> None:
    from drill.demo import train

    with pytest.raises(FileExistsError):
        train(pristine_run, SMALL_RUN)
