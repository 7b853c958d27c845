"""Files a run or a user names for drill to read outside a checkpoint — a batch job's output,
the policy a Kubernetes job carries — are read one way (``drill.storage.local.read_regular``):
regular files only (a FIFO would block the open forever, a device never end), and bounded (a
job that logged for hours leaves gigabytes, of which only the end is wanted)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from drill.launch.k8s import manifests
from drill.launch.submit import OUTPUT_TAIL, last_words
from drill.policy.load import load_policy
from drill.storage import NotARegularFile
from drill.storage.local import read_regular


def _sparse(path: Path, size: int, tail: bytes) -> Path:
    """A file of ``size`` bytes that costs no disk: a hole, then ``tail``."""
    with open(path, "wb") as f:
        f.truncate(size - len(tail))
        f.seek(size - len(tail))
        f.write(tail)
    return path


def _returns(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on a thread, waited for (a regression blocks on a FIFO: the test fails, not hangs)."""
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(fn(*args)), daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), f"{fn.__name__} blocked"
    return got[0]


def test_the_tail_of_a_file_of_any_size_is_read_alone(tmp_path: Path) -> None:
    big = _sparse(tmp_path / "job.out", 8 << 30, b"...\ndrill: failed: step-40 integrity\n")
    got = read_regular(big, 37, tail=True)
    assert got == b"...\ndrill: failed: step-40 integrity\n"[-37:]
    small = tmp_path / "small"
    small.write_bytes(b"abc")
    assert read_regular(small, 100, tail=True) == b"abc"  # shorter than the limit: all of it
    with pytest.raises(ValueError, match="more than 2 bytes"):
        read_regular(small, 2)  # without tail, more than the limit is refused, as before


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_tail_is_never_read_from_a_fifo_or_a_device(tmp_path: Path, kind: str) -> None:
    target = str(tmp_path / "out.fifo") if kind == "fifo" else "/dev/zero"
    if kind == "fifo":
        os.mkfifo(target)
    with pytest.raises(NotARegularFile):
        read_regular(target, 100, tail=True)


def test_a_jobs_last_words_come_from_the_end_of_its_output(tmp_path: Path) -> None:
    lines = b"".join(b"step %d loss 1.0\n" % i for i in range(2000)) + b"drill: failed: step-40 integrity\nbye\n"
    out = _sparse(tmp_path / "job.out", 4 << 30, lines)
    assert len(lines) > OUTPUT_TAIL  # the end alone is read, and it holds the last drill line
    assert _returns(last_words, str(out)) == "drill: failed: step-40 integrity"


@pytest.mark.parametrize("kind", ["fifo", "directory", "missing"])
def test_a_jobs_output_that_is_no_regular_file_has_no_last_words(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "job.out"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "directory":
        target.mkdir()
    assert _returns(last_words, str(target)) is None


def test_the_kubernetes_job_carries_the_policy_that_was_checked(tmp_path: Path) -> None:
    """The ConfigMap held the policy file re-read at render time: a file changed (or swapped for
    a FIFO) since it was loaded and checked reached the pods unchecked, or blocked the render."""
    path = tmp_path / "k8s.yaml"
    text = (
        f"name: nightly\ncheckpoints: {{root: {tmp_path}}}\nreplay: {{enabled: false}}\n"
        "allocation:\n  launcher: k8s\n  image: registry.internal/drill:0.3\n  volume_claim: checkpoints\n"
    )
    path.write_text(text)
    policy = load_policy(path)
    path.unlink()
    os.mkfifo(path)  # what is there by the time the manifests are rendered
    config = next(m for m in _returns(manifests, policy) if m["kind"] == "ConfigMap")
    assert config["data"]["policy.yaml"] == text
