"""Resume pointers of every shape — a symlink to a file or a directory, a text file, a JSON
field — judged whatever their writer: one naming a save never written is ``pointer-dangling``,
one ahead of the data ``pointer-ahead``, and a link is never drilled as a checkpoint of its own."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from drill.discover import discover
from drill.storage import LocalStorage
from tests.conftest import drill
from tests.test_unknown_writers import _directory_of_files


def _single_file_run(run: Path) -> str:
    """Composer's shape: ``ep0-ba3-rank0.pt`` files and ``latest-rank0.pt`` linking to the newest."""
    run.mkdir(parents=True)
    net = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict(), "step": 3}, run / "ep0-ba3-rank0.pt")
    return "ep0-ba3-rank0.pt"


def _point(run: Path, shape: str, target: str) -> str:
    """Write a pointer of ``shape`` naming ``target``; returns the pointer's name."""
    if shape == "symlink":
        name = "latest-rank0.pt" if target.endswith(".pt") else "latest"
        os.symlink(target, run / name)
        return name
    if shape == "text":
        (run / "latest.txt").write_text(target + "\n")
        return "latest.txt"
    path = str(run / target) if shape == "json-path" else target
    (run / "latest.json").write_text(json.dumps({"latest_checkpoint": path, "saved_at": "2026-12-07"}))
    return "latest.json"


CASES = {"works": None, "dangling": "pointer-dangling", "ahead": "pointer-ahead"}


@pytest.mark.parametrize("state", CASES)
@pytest.mark.parametrize(
    ("shape", "files"), [("symlink", True), ("symlink", False), ("text", False), ("json", False), ("json-path", False)]
)
def test_a_pointer_of_any_shape_is_judged(tmp_path: Path, sqlite_url: str, shape: str, files: bool, state: str) -> None:
    run = tmp_path / "run"
    if files:
        good, ahead = _single_file_run(run), "ep1-ba9-rank0.pt"
    else:
        good, ahead = _directory_of_files(run).name, "ckpt_000009"
    target = {"works": good, "dangling": "ckpt_final_copy", "ahead": ahead}[state]
    pointer = _point(run, shape, target)
    found = discover(LocalStorage(), str(run))
    assert [c.name for c in found.checkpoints] == [good]  # the link is a pointer, not a second checkpoint
    outcome = drill(run, sqlite_url)
    resume = [(f.code, f.subject) for f in outcome.findings if f.check == "resume"]
    if CASES[state] is None:
        assert outcome.status == "passed" and not resume, resume
    else:
        assert outcome.status == "failed" and (CASES[state], pointer) in resume, resume
