"""Replay built in for the trainers drill recognises: the recipes for the Hugging Face Trainer
(examples/hf_trainer) and Lightning (examples/lightning) replay the runs they trained, a replay
on other data diverges naming the step, and every shipped policy names replay code that exists."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "examples" / "hf_trainer"
LIGHTNING = ROOT / "examples" / "lightning"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    run = tmp_path_factory.mktemp("hf") / "run"
    subprocess.run([sys.executable, str(RECIPE / "train.py"), str(run)], check=True, capture_output=True, timeout=600)
    return run


@pytest.fixture(scope="module")
def lightning_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("lightning")
    run = tmp_path_factory.mktemp("lightning") / "run"
    subprocess.run(
        [sys.executable, str(LIGHTNING / "train.py"), str(run)], check=True, capture_output=True, timeout=600
    )
    return run


def _drill(run: Path, replay: str, tmp_path: Path, checkpoint: str = "checkpoint-4", env: dict | None = None) -> dict:
    res = subprocess.run(
        [sys.executable, "-m", "drill", "run", "--root", str(run), "--checkpoint", checkpoint, "--replay", replay,
         "--db", f"sqlite:///{tmp_path / 'drill.db'}", "--json", "-q"],
        capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert res.stdout, res.stderr[-3000:]
    assert "SLURM auto-requeueing" not in res.stderr  # the replay is not the batch job it runs in
    return json.loads(res.stdout)


def test_the_hf_trainer_recipe_replays_its_run(hf_run: Path, tmp_path: Path) -> None:
    """The Trainer resumes from checkpoint-4 with the run's own arguments and model class, one
    step at a time: steps 5–8 match the run's ``log_history``."""
    doc = _drill(hf_run, f"{RECIPE / 'replay.py'}:build_replay", tmp_path)
    replay = doc["replay"]
    assert doc["status"] == "passed" and replay["verdict"] == "passed", replay
    assert [s["step"] for s in replay["steps"]] == [5, 6, 7, 8]
    assert "match the original run within rtol=0.001" in replay["reason"]


def test_a_trainer_replay_on_other_data_diverges_naming_the_step(hf_run: Path, tmp_path: Path) -> None:
    """The same recipe fed a dataset the run did not train on: the first replayed step's loss
    leaves the run's, and the drill fails naming it."""
    other = tmp_path / "other_replay.py"
    other.write_text(
        "import torch\n"
        "from drill.integrations.hf import trainer_replay\n\n"
        "class Other(torch.utils.data.Dataset):\n"
        "    def __len__(self):\n        return 64\n"
        "    def __getitem__(self, i):\n"
        "        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(1000 + i))\n"
        "        return {'input_ids': ids, 'labels': ids}\n\n"
        "def build_replay(*, run_dir, checkpoint, device):\n"
        "    return trainer_replay(checkpoint, device, train_dataset=Other())\n"
    )
    doc = _drill(hf_run, f"{other}:build_replay", tmp_path)
    assert doc["status"] == "failed" and doc["replay"]["verdict"] == "diverged", doc["replay"]
    # untrained on random tokens, both losses sit near ln(64): the loss may agree to the log's
    # four decimals while the gradients do not — either way the first replayed step is named
    assert re.match(r"(loss|grad_norm) diverged at step 5:", doc["replay"]["reason"]), doc["replay"]["reason"]


def test_the_lightning_recipe_replays_its_run(lightning_run: Path, tmp_path: Path) -> None:
    """Lightning resumes the run's own module (built from the checkpoint's hyper-parameters) from
    the end of epoch 0: steps 9–13 match the run's ``metrics.csv``."""
    in_a_job = {"SLURM_JOB_ID": "5", "SLURM_JOB_NAME": "nightly", "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}
    doc = _drill(lightning_run, f"{LIGHTNING / 'replay.py'}:build_replay", tmp_path, "epoch=0-step=8.ckpt", in_a_job)
    replay = doc["replay"]
    assert replay["verdict"] == "passed", replay
    assert [s["step"] for s in replay["steps"]] == [9, 10, 11, 12, 13]


def test_a_lightning_replay_on_other_data_diverges_naming_the_step(lightning_run: Path, tmp_path: Path) -> None:
    """The run's module resumed on data it did not train on: the first replayed step leaves the
    run's ``metrics.csv``, named. (Another learning rate would not do: the optimizer's state,
    restored from the checkpoint, carries the run's own.)"""
    other = tmp_path / "other_replay.py"
    other.write_text(
        f"import sys\nsys.path.append({str(LIGHTNING)!r})\n"
        "import torch\n"
        "from model import Regression\n"
        "from drill.integrations.lightning import lightning_replay\n\n"
        "def build_replay(*, run_dir, checkpoint, device):\n"
        "    g = torch.Generator().manual_seed(1)\n"
        "    data = torch.utils.data.TensorDataset(torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g))\n"
        "    loader = torch.utils.data.DataLoader(data, batch_size=4)\n"
        "    return lightning_replay(checkpoint, device, module=Regression, train_dataloaders=loader)\n"
    )
    doc = _drill(lightning_run, f"{other}:build_replay", tmp_path, "epoch=0-step=8.ckpt")
    assert doc["replay"]["verdict"] == "diverged", doc["replay"]
    assert doc["replay"]["reason"].startswith("loss diverged at step 9:"), doc["replay"]["reason"]


def test_the_saved_arguments_are_the_runs_and_are_read_inert(hf_run: Path) -> None:
    from drill.integrations.hf import saved_arguments

    saved = saved_arguments(str(hf_run / "checkpoint-4"))
    assert (saved["seed"], saved["max_steps"], saved["per_device_train_batch_size"], saved["logging_steps"]) == (
        7,
        8,
        4,
        1,
    )
    assert all(isinstance(v, (str, int, float, bool, list, tuple, type(None))) for v in saved.values())


def test_every_shipped_policy_names_replay_code_that_exists() -> None:
    """A policy that replays names an entrypoint that is there — a file holding the function, or
    a module on the path; one that does not replay says so (``enabled: false``) or leaves it to
    the run's ``run.json`` (the demo)."""
    from drill.policy import load_policy
    from drill.replay.run import entrypoint_findable
    from drill.replay.spec import entrypoint_file

    checked = []
    for policy in sorted([*ROOT.glob("policies/*.yaml"), *ROOT.glob("examples/*/policy.yaml")]):
        loaded = load_policy(policy)
        entrypoint = loaded.replay.entrypoint
        if entrypoint is None or not loaded.replay.enabled:
            continue
        assert entrypoint_findable(entrypoint, str(policy.parent)), (policy.name, entrypoint)
        file = entrypoint_file(entrypoint)
        if file is not None:
            assert f"def {entrypoint.rpartition(':')[2]}(" in Path(file).read_text(), (policy.name, entrypoint)
        checked.append(policy.name)
    assert {"hf-trainer.yaml", "lightning.yaml", "policy.yaml"} <= set(checked), checked
