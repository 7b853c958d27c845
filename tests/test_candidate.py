"""The version-upgrade drill: ``drill run --python PATH`` replays under a candidate environment —
here a real second virtualenv whose trainer code is the team's "next commit" — probes it
before the drill begins, and records which environment proved what."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from drill import history
from drill.policy.load import load_policy

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "my_trainer"

pytestmark = pytest.mark.slow

NEXT_COMMIT = """
from collections import OrderedDict

import torch
from trainer import THREADS, Training

RENAMED = {renamed}


class Next(Training):
    threads = THREADS

    def __init__(self, device):
        super().__init__(device)
        if RENAMED:  # the next commit names the output layer: the same modules, other keys
            layers = list(self.model)
            self.model = torch.nn.Sequential(OrderedDict([("0", layers[0]), ("1", layers[1]), ("2", layers[2]), ("head", layers[3])]))


def build_replay(*, run_dir, checkpoint, device):
    return Next(device)
"""


@pytest.fixture(scope="module")
def my_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("candidate") / "run"
    subprocess.run([sys.executable, str(EXAMPLE / "trainer.py"), str(run), "--steps", "20", "--save-every", "10"],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    return run


def _candidate(base: Path, *, renamed: bool, moved: bool = False) -> Path:
    """A virtualenv of its own (no pip: nothing downloaded) that sees this one's packages —
    torch, drill — and holds the next commit's trainer code, ``nexttrainer``, which drill's
    own environment does not have."""
    env = base / ("renamed" if renamed else "moved" if moved else "same")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    code = env / "code"
    code.mkdir()
    (code / "nexttrainer.py").write_text(NEXT_COMMIT.format(renamed=renamed))
    site = next(env.glob("lib/python3*/site-packages"))
    lines = [f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})", str(code), str(EXAMPLE)]
    if moved:  # a torch whose DCP metadata class moved (as 2.4 could not load 2.3's: pytorch#133923)
        lines.append("import torch.distributed.checkpoint.metadata as m; m.__dict__.pop('TensorStorageMetadata', None)")
    (site / "candidate.pth").write_text("\n".join(lines) + "\n")
    return env / "bin" / "python"


def _drill(run: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "drill", "run", "--root", str(run), "--checkpoint", "step:10",
         "--db", f"sqlite:///{tmp_path / 'drill.db'}", "--json", "-q", *args],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip


def test_a_candidate_whose_model_renames_a_parameter_fails_naming_the_key(my_run: Path, tmp_path: Path) -> None:
    python = _candidate(tmp_path, renamed=True)
    res = _drill(my_run, tmp_path, "--replay", "nexttrainer:build_replay", "--python", str(python))
    doc = json.loads(res.stdout)
    replay = doc["replay"]
    assert res.returncode == 1 and doc["status"] == "failed" and replay["verdict"] == "diverged", (
        replay,
        res.stderr[-2000:],
    )
    reason = replay["reason"]
    assert reason.startswith("the replay's training objects do not take the checkpoint as saved: they ask for "), reason
    assert "model.head.weight" in reason and "model.3.weight" in reason and reason.endswith("the resume fails"), reason
    (check,) = [c for c in doc["checks"] if c["name"] == "replay"]
    assert check["findings"][0]["code"] == "replay-diverged-keys"
    environment = check["evidence"]["environment"]
    assert environment["candidate"]["executable"] == str(python)
    assert environment["candidate"]["packages"]["torch"] == environment["current"]["packages"]["torch"]
    assert environment["changed"] == {}  # the same packages: what changed is the trainer's code


def test_a_candidate_where_a_class_the_checkpoint_names_moved_fails_naming_it(my_run: Path, tmp_path: Path) -> None:
    python = _candidate(tmp_path, renamed=False, moved=True)
    res = _drill(my_run, tmp_path, "--replay", "nexttrainer:build_replay", "--python", str(python))
    doc = json.loads(res.stdout)
    replay = doc["replay"]
    assert res.returncode == 1 and replay["verdict"] == "diverged", (replay, res.stderr[-2000:])
    assert replay["reason"].startswith(
        "under the candidate environment the checkpoint does not restore: it needs "
        "torch.distributed.checkpoint.metadata.TensorStorageMetadata, which the candidate's code no longer has"
    ), replay["reason"]
    (check,) = [c for c in doc["checks"] if c["name"] == "replay"]
    assert check["findings"][0]["code"] == "replay-diverged-classes"


def test_an_unchanged_candidate_passes_and_the_record_says_which_environment(my_run: Path, tmp_path: Path) -> None:
    python = _candidate(tmp_path, renamed=False)
    res = _drill(my_run, tmp_path, "--replay", "nexttrainer:build_replay", "--python", str(python))
    doc = json.loads(res.stdout)
    assert res.returncode == 0 and doc["replay"]["verdict"] == "passed", (doc["replay"], res.stderr[-2000:])
    assert "bit for bit" in doc["replay"]["reason"]
    res = subprocess.run([sys.executable, "-m", "drill", "report", "--db", f"sqlite:///{tmp_path / 'drill.db'}"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0 and "candidate" in res.stdout, res.stdout


def test_a_candidate_that_cannot_run_drill_is_a_usage_error_before_anything_is_recorded(
    my_run: Path, tmp_path: Path
) -> None:
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-I", "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    for python, says in (
        (
            bare / "bin" / "python",
            "the candidate environment cannot import drill (ModuleNotFoundError: No module named 'drill')",
        ),
        (tmp_path / "nowhere" / "python", "not an executable file"),
    ):
        res = _drill(my_run, tmp_path, "--replay", "nexttrainer:build_replay", "--python", str(python))
        assert res.returncode == 2 and says in res.stderr, res.stderr[-2000:]
        assert "Traceback" not in res.stderr
    assert history(db=f"sqlite:///{tmp_path / 'drill.db'}") == []


def test_a_policy_names_its_candidate_relative_to_itself(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text("name: next\ncheckpoints:\n  root: run\nreplay:\n  python: envs/next/bin/python\n  ranks: 2\n")
    loaded = load_policy(str(policy))
    assert loaded.replay.python == os.path.join(str(tmp_path), "envs/next/bin/python") and loaded.replay.ranks == 2
