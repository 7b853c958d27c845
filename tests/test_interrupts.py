"""Ctrl-C and SIGTERM at every phase of a real drill: one aborted record, one line, fast."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from drill import history
from tests.support.drive import start, wait_for
from tests.support.replay_targets import REPLAYING

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize(
    ("phase", "recorded_phase"),
    [
        ("discover", None),
        ("plan", "plan"),
        ("restore", "restore"),
        ("read", "restore"),
        ("checks", "checks"),
        ("replay", "replay"),
    ],
    ids=["discover", "plan", "restore", "inside-dcp-load", "checks", "replay"],
)
def test_an_interrupt_at_any_phase_is_one_aborted_record(
    demo_run: Path, sqlite_url: str, tmp_path: Path, phase: str, recorded_phase: str | None, sig: int
) -> None:
    marker, replaying = tmp_path / "arrived", tmp_path / "replaying"
    extra = ("--replay", "tests.support.replay_targets:hanging") if phase == "replay" else ("--no-replay",)
    proc = start(phase, marker, "--root", str(demo_run), "--db", sqlite_url, *extra, env={REPLAYING: str(replaying)})
    wait_for(marker, proc)
    if phase == "replay":
        wait_for(replaying, proc)  # the replay child is in its step
    sent = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    took = time.monotonic() - sent
    assert proc.returncode == (130 if sig == signal.SIGINT else 143), err
    assert took < 2.0, f"took {took:.1f} s to stop"
    lines = [ln for ln in err.splitlines() if not ln.startswith("drill: +")]
    name = signal.Signals(sig).name
    if recorded_phase is None:  # listing the run happens before the record opens: nothing to abort
        assert (
            lines == [f"drill: aborted: interrupted by {name} (nothing was recorded)"] and history(db=sqlite_url) == []
        )
        return
    (drill,) = history(db=sqlite_url)
    assert lines == [
        f"drill: aborted: interrupted by {name} during {recorded_phase} (drill #{drill.id} recorded as aborted)"
    ]
    assert drill.status == "aborted" and drill.phase == recorded_phase and drill.finished_at is not None
    assert int(drill.exit_code) == proc.returncode


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupt_before_the_record_exists_claims_none(
    demo_run: Path, sqlite_url: str, tmp_path: Path, sig: int
) -> None:
    marker = tmp_path / "arrived"
    proc = start("open-db", marker, "--root", str(demo_run), "--db", sqlite_url, "--no-replay")
    wait_for(marker, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == (130 if sig == signal.SIGINT else 143)
    name = signal.Signals(sig).name
    assert err.strip().splitlines() == [f"drill: aborted: interrupted by {name} (nothing was recorded)"]
    assert history(db=sqlite_url) == []


def test_the_replay_child_goes_with_the_drill(demo_run: Path, sqlite_url: str, tmp_path: Path) -> None:
    marker, replaying = tmp_path / "arrived", tmp_path / "replaying"
    proc = start(
        "replay",
        marker,
        "--root",
        str(demo_run),
        "--db",
        sqlite_url,
        "--replay",
        "tests.support.replay_targets:hanging",
        env={REPLAYING: str(replaying)},
    )
    wait_for(marker, proc)
    wait_for(replaying, proc)
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert children, "the replay child should be running"
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while alive := [pid for pid in children if _exists(int(pid))]:  # gone with it, not merely later
        assert time.monotonic() < deadline, f"the replay child outlived the drill: {alive}"
        time.sleep(0.05)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_signal_while_the_schema_is_made_waits_until_it_is_whole(tmp_path: Path) -> None:
    """SIGTERM between two migrations of a new database (a launcher stopping a drill on its first
    use of the file): the signal waits for the schema — the process still ends by it — and the
    next command finds a database at head, never one "damaged or edited outside drill"."""
    import sys

    db = f"sqlite:///{tmp_path / 'drill.db'}"
    env = {**os.environ, "DRILL_FAILPOINTS": "migrated=term"}
    stopped = subprocess.run(
        [sys.executable, "-m", "drill", "db", "upgrade", "--db", db], env=env, capture_output=True, text=True
    )
    assert stopped.returncode == 143 and "interrupted by SIGTERM" in stopped.stderr, stopped.stderr
    again = subprocess.run([sys.executable, "-m", "drill", "db", "upgrade", "--db", db], capture_output=True, text=True)
    assert again.returncode == 0 and "is up to date" in again.stdout + again.stderr, again.stderr
    assert history(db=db) == []


HELD_WITH_A_THREAD = """
import sys, threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # a heartbeat's, a store's
from drill.cli.common import terminate_as_interrupt
from drill.records.db import upgrade
terminate_as_interrupt()
try:
    upgrade(sys.argv[1])
except KeyboardInterrupt as exc:
    print(f"stopped after the migration: {exc}")
"""


def test_a_signal_a_second_thread_takes_still_waits_for_the_schema(tmp_path: Path) -> None:
    """A process-directed SIGTERM reaches whichever thread does not block it — in a distributed
    drill, the heartbeat thread — and Python runs the handler in the main thread all the same:
    holding the signal off by the main thread's mask alone left the schema half made (tables,
    no revision) under torchrun. With a second thread running, the schema is still whole."""
    import sys

    db = f"sqlite:///{tmp_path / 'drill.db'}"
    env = {**os.environ, "DRILL_FAILPOINTS": "migrated=term"}
    res = subprocess.run([sys.executable, "-c", HELD_WITH_A_THREAD, db], env=env, capture_output=True, text=True)
    assert "stopped after the migration: interrupted by SIGTERM" in res.stdout, res.stderr[-2000:]
    assert history(db=db) == []  # at head: not "holds drill's tables but no schema revision"
