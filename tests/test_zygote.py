"""The `drill` command forks its replay child before anything runs, so the replay skips the
interpreter's start-up; the fork never outlives the drill, and where it is not safe (a library
call, a second thread) the replay starts a fresh interpreter as before."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from drill.proc import process_claimed
from drill.replay.zygote import Zygote, take
from tests.support.drive import ROOT, start, wait_for

SPY = """
import sys
from pathlib import Path
import drill.replay.zygote as z
log = Path(sys.argv[1])
fork, launch = z.Zygote.fork.__func__, z.Zygote.launch
def spy_fork(cls):
    got = fork(cls)
    if got is not None:
        log.write_text(f"forked {got.child.pid}\\n")
    return got
def spy_launch(self, args, path):
    with log.open("a") as f:
        f.write("launched\\n")
    return launch(self, args, path)
z.Zygote.fork = classmethod(spy_fork)
z.Zygote.launch = spy_launch
from drill.cli.app import main
sys.argv = ["drill", *sys.argv[2:]]
main()
"""


def _drill(log: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", SPY, str(log), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def _gone(pid: int, within: float = 10) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def _forked_pid(log: Path) -> int:
    first = log.read_text().splitlines()[0]
    assert first.startswith("forked "), first
    return int(first.split()[1])


@pytest.mark.slow
def test_the_command_replays_in_the_child_it_forked(demo_run: Path, tmp_path: Path) -> None:
    log = tmp_path / "zygote.log"
    done = _drill(log, "run", "--root", str(demo_run), "--db", str(tmp_path / "d.db"), "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["status"] == "passed" and doc["replay"]["verdict"] == "passed", doc["replay"]
    assert log.read_text().splitlines()[1:] == ["launched"]
    assert _gone(_forked_pid(log))


@pytest.mark.slow
def test_a_fork_the_drill_does_not_use_goes_with_it(demo_run: Path, tmp_path: Path) -> None:
    """A drill that fails before its replay ends its fork at once (no process left behind)."""
    ckpt = sorted(demo_run.glob("step-*"))[-1]
    (ckpt / "__0_0.distcp").write_bytes(b"not a shard")
    log = tmp_path / "zygote.log"
    done = _drill(log, "run", "--root", str(demo_run), "--db", str(tmp_path / "d.db"))
    assert done.returncode == 1, done.stderr
    assert "launched" not in log.read_text()
    assert _gone(_forked_pid(log), within=2)


@pytest.mark.slow
def test_no_fork_without_a_replay(demo_run: Path, tmp_path: Path) -> None:
    log = tmp_path / "zygote.log"
    done = _drill(log, "run", "--root", str(demo_run), "--db", str(tmp_path / "d.db"), "--no-replay")
    assert done.returncode == 0, done.stderr
    assert not log.exists()


@pytest.mark.slow
def test_a_replay_that_fails_in_the_fork_is_reported(demo_run: Path, tmp_path: Path) -> None:
    log = tmp_path / "zygote.log"
    done = _drill(
        log, "run", "--root", str(demo_run), "--db", str(tmp_path / "d.db"), "--json", "--replay", "json:loads"
    )
    doc = json.loads(done.stdout)
    assert "launched" in log.read_text()
    assert doc["replay"]["verdict"] in ("error", "refused"), doc["replay"]
    assert "TypeError: loads()" in doc["replay"]["reason"] and done.returncode != 0


@pytest.mark.slow
def test_the_fork_dies_with_a_killed_drill(demo_run: Path, tmp_path: Path) -> None:
    marker = tmp_path / "at-checks"
    proc = start("checks", marker, "--root", str(demo_run), "--db", str(tmp_path / "d.db"))
    try:
        wait_for(marker, proc)
        (zygote,) = psutil.Process(proc.pid).children()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert _gone(zygote.pid), "the forked replay child outlived the drill"
    finally:
        proc.kill()
        proc.communicate()


def test_no_fork_where_it_is_not_safe(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not process_claimed()  # a test runner, not the drill command: prepare() is never called
    assert Zygote.fork() is None
    monkeypatch.setattr("drill.proc._claimed", True)
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        assert Zygote.fork() is None  # a second thread: its locks would be held forever in the fork
    finally:
        release.set()
        other.join()
    assert take() is None


@pytest.mark.parametrize("replay", [True, False])
@pytest.mark.slow
def test_library_drills_start_a_fresh_child(demo_run: Path, tmp_path: Path, replay: bool) -> None:
    """run_drill from a caller's process never forks it: the caller may have used torch."""
    from drill import DrillRequest, run_drill
    from drill.replay import ReplaySpec

    outcome = run_drill(
        DrillRequest(root=str(demo_run), replay=ReplaySpec(enabled=replay)), db=f"sqlite:///{tmp_path}/d.db"
    )
    assert outcome.status.value == "passed"
    assert take() is None
