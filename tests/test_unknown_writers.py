"""Checkpoints of writers no format module claims: state known by what it is, wherever its
writer nested it (drill/formats/state_view.py), and a step directory of ``torch.save`` /
safetensors / JSON files drilled as one checkpoint (drill/formats/unknown.py) — a state view
and a verdict, never "no complete checkpoint"."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from drill.checkpoints import step_of
from drill.discover import discover
from drill.formats import state_view
from drill.integrity.manifest import seal_files as seal
from drill.storage import LocalStorage
from drill.verifier import verify_checkpoint
from tests.conftest import drill


def _trained(steps: int = 3) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    for _ in range(steps):
        net(torch.randn(5, 4)).sum().backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    return net, opt, sched


def _own_names_file(run: Path, steps: int = 3) -> Path:
    """A hand-written trainer that nests its state under names of its own, in one torch.save file."""
    net, opt, sched = _trained(steps)
    run.mkdir(parents=True, exist_ok=True)
    path = run / f"step_{steps}.pt"
    torch.save(
        {
            "trainer": {"net": net.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()},
            "progress": {"global_step": steps, "epoch": 0},
            "generators": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "py": random.getstate()},
            "sampler": {"offset": 5 * steps, "seed": 0},
        },
        path,
    )
    return path


def _directory_of_files(run: Path, name: str = "ckpt_000003", steps: int = 3) -> Path:
    """A directory of safetensors weights and torch.save / JSON side files, by a writer of its own."""
    from safetensors.torch import save_file

    net, opt, _ = _trained(steps)
    ckpt = run / name
    ckpt.mkdir(parents=True)
    save_file(net.state_dict(), str(ckpt / "weights.safetensors"))
    torch.save({"opt": opt.state_dict()}, ckpt / "optim.pt")
    torch.save({"cpu": torch.get_rng_state(), "python": random.getstate()}, ckpt / "rng.pt")
    (ckpt / "progress.json").write_text(json.dumps({"global_step": steps, "loader": {"position": 5 * steps}}))
    return ckpt


def _errors(outcome) -> list[tuple[str, str | None]]:
    return [(f.code, f.subject) for f in outcome.findings if f.severity.value == "error"]


def test_a_writers_own_names_are_read_by_what_their_values_are(tmp_path: Path, sqlite_url: str) -> None:
    _own_names_file(tmp_path / "run")
    outcome = drill(tmp_path / "run", sqlite_url)
    assert outcome.status == "passed", _errors(outcome)
    keys = next(c for c in outcome.checks if c.name == "keys")
    assert keys.evidence["parts"] == {
        "dataloader": 2, "lr_scheduler": 8, "model": 4, "optimizer": 25, "rng": 3, "train_state": 4,
    }  # fmt: skip
    for where in ("optimizer at trainer.opt", "model at trainer.net (4 tensors)", "lr_scheduler at trainer.sched",
                  "dataloader at sampler", "rng at generators", "step 3 at progress.global_step"):  # fmt: skip
        assert where in keys.evidence["layout"], keys.evidence["layout"]
    assert "unknown writer" in keys.evidence["layout"]


def test_a_directory_of_an_unknown_writer_is_one_checkpoint_with_a_verdict(tmp_path: Path, sqlite_url: str) -> None:
    ckpt = _directory_of_files(tmp_path / "run")
    outcome = drill(tmp_path / "run", sqlite_url)
    assert outcome.status == "passed" and outcome.exit_code == 0, _errors(outcome)
    assert outcome.checkpoint is not None and outcome.checkpoint.format == "unknown" and outcome.checkpoint.step == 3
    keys = next(c for c in outcome.checks if c.name == "keys")
    assert {"model", "optimizer", "rng", "dataloader", "train_state"} <= set(keys.evidence["parts"])
    verified = verify_checkpoint(str(ckpt))
    assert verified.status == "passed" and not verified.result.findings


def _drop_one_slot(path: Path) -> None:
    obj = torch.load(path, weights_only=False)  # the test's own file: trusted
    del obj["opt"]["state"][0]["exp_avg"]
    torch.save(obj, path)


@pytest.mark.parametrize(
    ("damage", "named"),
    [("flip", "optim.pt"), ("truncate", "weights.safetensors"), ("delete", "optimizer"), ("slot", "optimizer")],
)
def test_damage_to_an_unknown_writers_checkpoint_fails_naming_it(
    tmp_path: Path, sqlite_url: str, damage: str, named: str
) -> None:
    ckpt = _directory_of_files(tmp_path / "run")
    if damage == "flip":
        seal(str(ckpt))
        data = bytearray((ckpt / "optim.pt").read_bytes())
        data[len(data) // 2] ^= 0x01
        (ckpt / "optim.pt").write_bytes(bytes(data))
    elif damage == "truncate":
        os.truncate(ckpt / "weights.safetensors", (ckpt / "weights.safetensors").stat().st_size // 2)
    elif damage == "delete":
        (ckpt / "optim.pt").unlink()
    else:
        _drop_one_slot(ckpt / "optim.pt")
    outcome = drill(tmp_path / "run", sqlite_url)
    assert outcome.status == "failed" and outcome.exit_code == 1, _errors(outcome)
    assert any(s is not None and named in s for _, s in _errors(outcome)), _errors(outcome)
    if damage in ("flip", "truncate"):
        verified = verify_checkpoint(str(ckpt))
        assert verified.status == "failed"
        assert any(named in str(f.subject) for f in verified.result.findings), verified.result.findings


def test_a_writers_temporary_file_makes_its_save_unfinished(tmp_path: Path) -> None:
    ckpt = _directory_of_files(tmp_path / "run")
    (ckpt / "optim.pt.tmp").write_bytes(b"half")
    found = discover(LocalStorage(), str(tmp_path / "run"))
    assert not found.checkpoints
    assert "optim.pt.tmp" in found.incomplete[0].reason and "never finished" in found.incomplete[0].reason


def test_a_directory_without_a_step_in_its_name_or_state_files_is_no_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "run" / "logs").mkdir(parents=True)
    torch.save({"loss": [1.0, 0.5]}, tmp_path / "run" / "logs" / "history.pt")
    (tmp_path / "run" / "step-4").mkdir()
    (tmp_path / "run" / "step-4" / "notes.txt").write_text("nothing saved")
    found = discover(LocalStorage(), str(tmp_path / "run"))
    assert not found.checkpoints and [s.name for s in found.incomplete] == ["step-4"]


# -- the state view, value by value -----------------------------------------------------------
def test_generators_are_known_by_their_shape_whatever_their_key() -> None:
    state, _ = state_view.view(
        {"r": {"a": torch.get_rng_state(), "b": np.random.get_state(), "c": random.getstate(),
               "d": [torch.zeros(16, dtype=torch.uint8)], "e": np.random.default_rng(0).bit_generator.state}},
        format="unknown",
    )  # fmt: skip
    assert {k for k in state if k.startswith("rng.")} == {"rng.torch", "rng.numpy", "rng.python", "rng.cuda"}
    assert not state_view.generator_of(torch.zeros(5056))  # a float tensor of that size is a tensor


def test_per_rank_generators_are_named_by_rank() -> None:
    ranks = [{"python": random.getstate(), "torch": torch.get_rng_state()} for _ in range(2)]
    state, layout = state_view.view({"rng": ranks}, format="unknown")
    assert {"rng.rank_0.python", "rng.rank_1.torch"} <= set(state)
    assert "2 ranks' generators at rng" in str(layout.recognized)


def test_the_model_is_the_state_dict_the_optimizer_names() -> None:
    net, opt, _ = _trained()
    named_state = {name: opt.state_dict()["state"][i] for i, (name, _) in enumerate(net.named_parameters())}
    ema = {f"shadow.{i}": torch.zeros(3) for i in range(10)}  # larger, but not what the optimizer updates
    optimizer = {"state": named_state, "param_groups": [{"params": list(named_state)}]}
    state, layout = state_view.view({"ema": ema, "weights": net.state_dict(), "opt": optimizer}, format="unknown")
    assert "model.0.weight" in state and "extra.ema.shadow.0" in state
    assert layout.optimizer_keys == "fqn"


def test_a_second_optimizer_is_kept_and_said_unchecked() -> None:
    _, opt, _ = _trained()
    state, layout = state_view.view({"g": opt.state_dict(), "d": {"state": {}, "param_groups": []}}, format="unknown")
    assert "optimizer.state.0.exp_avg" in state
    assert "another optimizer at d (kept, not checked)" in str(layout.recognized)


def test_the_most_telling_step_counter_is_the_step() -> None:
    state, _ = state_view.view({"iteration": 800, "meta": {"global_step": 800, "epoch": 3}}, format="unknown")
    assert state["train_state.step"] == 800 and state["train_state.epoch"] == 3
    assert state["train_state.meta.global_step"] == 800 and state["train_state.iteration"] == 800


def test_a_state_nested_past_the_bound_is_refused() -> None:
    deep: dict = {}
    node = deep
    for _ in range(state_view.MAX_DEPTH + 2):
        node["x"] = {}
        node = node["x"]
    node["x"] = torch.ones(1)
    with pytest.raises(state_view.Unbounded, match="nested more than"):
        state_view.view(deep, format="unknown")


@pytest.mark.parametrize(
    ("name", "step"),
    [("step-40", 40), ("checkpoint-8", 8), ("iter_0000800", 800), ("global_step8", 8), ("ckpt_000008", 8),
     ("ep1-ba8", 8), ("ep1-ba16-rank0.pt", 16), ("epoch=1-step=8.ckpt", 8), ("step=8", 8), ("model_step_400.pt", 400),
     ("latest-rank0.pt", None), ("epoch_2", None), ("run.pt", None), ("notes", None)],
)  # fmt: skip
def test_steps_are_read_from_names_however_a_writer_writes_them(name: str, step: int | None) -> None:
    assert step_of(name) == step


def test_a_file_an_unknown_writers_other_saves_hold_is_missing_from_this_one(tmp_path: Path, sqlite_url: str) -> None:
    _directory_of_files(tmp_path / "run", "ckpt_000003")
    newer = _directory_of_files(tmp_path / "run", "ckpt_000004", steps=4)
    (newer / "rng.pt").unlink()
    outcome = drill(tmp_path / "run", sqlite_url)
    assert outcome.checkpoint is not None and outcome.checkpoint.name == "ckpt_000004"
    assert outcome.status == "failed" and ("file-missing", "rng.pt") in _errors(outcome), _errors(outcome)
