"""Nothing lost under faults: SIGKILL at every phase, the database stopped mid-drill, many
drills at once, resource limits, and no leak across a hundred drills in one process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from typer.testing import CliRunner

from drill import history
from tests.conftest import drill as _drill
from tests.conftest import invoke
from tests.support.drive import start, wait_for

pytestmark = pytest.mark.slow
DRILL = str(Path(sys.executable).parent / "drill")


# -- 1. SIGKILL at every phase ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("phase", "recorded"),
    [
        ("discover", None),
        ("plan", "plan"),
        ("restore", "restore"),
        ("read", "restore"),
        ("checks", "checks"),
        ("replay", "replay"),
    ],
    ids=["discover", "plan", "restore", "inside-the-read", "checks", "replay"],
)
def test_sigkill_at_any_phase_is_reconciled_to_aborted_with_the_phase(
    demo_run: Path, sqlite_url: str, tmp_path: Path, phase: str, recorded: str | None
) -> None:
    marker = tmp_path / "arrived"
    extra = ("--replay", "tests.support.replay_targets:hanging") if phase == "replay" else ("--no-replay",)
    proc = start(phase, marker, "--root", str(demo_run), "--db", sqlite_url, *extra)
    wait_for(marker, proc)
    proc.send_signal(signal.SIGKILL)  # no handler runs: the row is left `running`
    proc.communicate(timeout=30)
    if recorded is None:  # the run is listed before the record opens: killed there, nothing was begun
        assert history(db=sqlite_url) == [] and _drill(demo_run, sqlite_url).status.value == "passed"
        return
    (killed,) = history(db=sqlite_url)
    assert killed.status == "running" and killed.phase == recorded
    after = _drill(demo_run, sqlite_url)  # the next start reconciles
    assert after.status.value == "passed"
    killed = next(d for d in history(db=sqlite_url) if d.id == killed.id)
    assert killed.status == "aborted" and killed.phase == recorded and killed.finished_at is not None
    assert f"last phase reached: {recorded}" in (killed.message or "")


# -- 2. the database stopped during a drill --------------------------------------------------
def _pg(action: str) -> None:
    versions = os.listdir("/etc/postgresql")
    subprocess.run(
        [
            "pg_ctlcluster",
            "--skip-systemctl-redirect",
            versions[0],
            "main",
            action,
            *(["-m", "fast"] if action == "stop" else []),
        ],
        check=True,
        capture_output=True,
    )
    if action == "start":
        for _ in range(60):
            if subprocess.run(["pg_isready", "-h", "127.0.0.1", "-p", "5432", "-q"]).returncode == 0:
                return
            time.sleep(0.5)
        raise RuntimeError("PostgreSQL did not come back")


@pytest.mark.postgres
def test_postgres_stopped_mid_drill_spools_the_verdict_and_flush_delivers_it_once(
    demo_run: Path, postgres_to_restart: None, postgres_url: str, tmp_path: Path, private_spool: Path
) -> None:
    if shutil.which("pg_ctlcluster") is None or os.geteuid() != 0:
        pytest.skip("needs the right to stop and start the live PostgreSQL (pg_ctlcluster as root)")
    from drill.records.db import upgrade

    db_url = postgres_url
    upgrade(db_url)
    marker, release = tmp_path / "arrived", tmp_path / "go"
    proc = start(
        "checks",
        marker,
        "--root",
        str(demo_run),
        "--db",
        db_url,
        "--no-replay",
        env={"DRILL_TEST_RELEASE": str(release)},
    )
    wait_for(marker, proc)
    _pg("stop")
    try:
        release.touch()
        _, err = proc.communicate(timeout=120)
    finally:
        _pg("start")
    assert proc.returncode == 0, err  # the drill's verdict stands: the database is not the checkpoint
    assert "the verdict is kept in" in err
    (spooled,) = list(private_spool.glob("*.json"))
    assert stat.S_IMODE(spooled.stat().st_mode) == 0o600
    runner = CliRunner()
    first = invoke(runner, "db", "flush", "--db", db_url)
    assert first.exit_code == 0 and "delivered 1 spooled verdict(s)" in first.stdout
    again = invoke(runner, "db", "flush", "--db", db_url)
    assert again.exit_code == 0 and "delivered 0 spooled verdict(s)" in again.stdout
    (drilled,) = history(db=db_url)
    assert drilled.status == "passed" and drilled.finished_at is not None


def test_a_database_found_away_is_tried_once_per_later_write_until_it_answers(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transient failure that outlasts the retries marks the database away: each later write
    of the drill is tried once, not waited out again (a dead server cost ~7 s a drill), and
    the first write that gets through brings the retries back."""
    from drill.errors import DatabaseError
    from drill.records.db import open_database
    from drill.records.recorder import ATTEMPTS, DatabaseRecorder

    monkeypatch.setattr("drill.records.recorder.BACKOFF", (0.0, 0.0))
    calls: list[str] = []

    def write(name: str, *, fails: bool, transient: bool = True):
        def fn() -> str:
            calls.append(name)
            if fails:
                err = DatabaseError(f"{name}: connection refused")
                err.transient = transient
                raise err
            return name

        return fn

    database = open_database(sqlite_url)
    try:
        recorder = DatabaseRecorder(database)
        with pytest.raises(DatabaseError):
            recorder._retry(write("lost", fails=True, transient=False))  # not worth retrying: once
        assert calls == ["lost"] and not recorder.away
        with pytest.raises(DatabaseError):
            recorder._retry(write("first", fails=True))
        assert calls.count("first") == ATTEMPTS and recorder.away
        for name in ("phase", "checks", "finish"):
            with pytest.raises(DatabaseError):
                recorder._retry(write(name, fails=True))
            assert calls.count(name) == 1
        assert recorder._retry(write("back", fails=False)) == "back" and not recorder.away
        with pytest.raises(DatabaseError):
            recorder._retry(write("again", fails=True))
        assert calls.count("again") == ATTEMPTS
    finally:
        database.close()


def test_a_flush_that_died_before_unlinking_delivers_nothing_twice(
    demo_run: Path, sqlite_url: str, private_spool: Path
) -> None:
    from drill.records.db import open_database
    from drill.records.recorder import DatabaseRecorder
    from drill.records.spool import Spool
    from drill.records.urls import database_key

    outcome = _drill(demo_run, sqlite_url)
    doc = outcome.to_document()
    doc["id"], doc["pid"] = None, 999_999_999  # another drill, which never got a row: spooled, delivered, unlink lost
    spool = Spool(database_key(sqlite_url))
    spool.put(doc)
    spool.put(doc)
    database = open_database(sqlite_url)
    try:
        result = DatabaseRecorder(database).flush()
        assert (result.delivered, result.left) == (1, 0)
    finally:
        database.close()
    assert len(history(db=sqlite_url)) == 2  # the original drill and the one delivered copy


def _spooled_doc(demo_run: Path, sqlite_url: str) -> dict:
    doc = _drill(demo_run, sqlite_url).to_document()
    doc["id"], doc["pid"] = None, 999_999_998
    return doc


SPOOL_FAULTS = {
    "another user's file": lambda p: os.chown(p, 65534, 65534),
    "readable by others": lambda p: os.chmod(p, 0o644),
    "a symlink to a verdict": lambda p: (os.rename(p, p.with_name("real")), os.symlink(p.with_name("real"), p)),
    "not JSON": lambda p: p.write_text("{not json"),
    "a JSON list": lambda p: p.write_text("[1, 2, 3]"),
    "an object of the wrong shape": lambda p: p.write_text(json.dumps({"id": None, "status": "passed"})),
    "an unknown status": lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "status": "bogus"})),
}


@pytest.mark.parametrize("fault", list(SPOOL_FAULTS))
def test_a_spool_file_drill_cannot_vouch_for_is_named_never_delivered_and_blocks_nothing(
    demo_run: Path, sqlite_url: str, private_spool: Path, fault: str
) -> None:
    """A planted "passed" verdict (another user's file, a file others could write, a link) is
    never delivered; a corrupt or misshapen one is named, not skipped silently; either way
    ``db flush`` exits 1 and later drills still run and record."""
    from drill.records.spool import Spool
    from drill.records.urls import database_key

    if fault == "another user's file" and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    path = Spool(database_key(sqlite_url)).put(_spooled_doc(demo_run, sqlite_url))
    SPOOL_FAULTS[fault](path)
    runner = CliRunner()
    res = invoke(runner, "db", "flush", "--db", sqlite_url, "--json")
    assert res.exit_code == 1, (res.exit_code, res.stdout, res.stderr)
    doc = json.loads(res.stdout)
    assert doc["delivered"] == 0 and doc["left"] == 1 and list(doc["rejected"]) == [str(path)]
    assert len(history(db=sqlite_url)) == 1  # only the drill that made the document
    res = invoke(runner, "run", "--root", str(demo_run), "--db", sqlite_url, "--no-replay", "-q")
    assert res.exit_code == 0, res.stderr
    assert "cannot be delivered" in res.stderr and len(history(db=sqlite_url)) == 2


def test_concurrent_flushes_deliver_each_spooled_verdict_once(demo_run: Path, db_url: str, private_spool: Path) -> None:
    from drill.records.spool import Spool
    from drill.records.urls import database_key

    base = _drill(demo_run, db_url).to_document()
    spool = Spool(database_key(db_url))
    for i in range(6):
        spool.put({**base, "id": None, "pid": 900_000 + i})
    with ThreadPoolExecutor(4) as pool:
        codes = list(
            pool.map(
                lambda _: (
                    subprocess.run(
                        [DRILL, "db", "flush", "--db", db_url], capture_output=True, text=True, timeout=120
                    ).returncode
                ),
                range(4),
            )
        )
    assert codes == [0, 0, 0, 0]
    assert len(history(db=db_url)) == 7
    assert not list(private_spool.iterdir())


def test_flush_with_the_database_away_keeps_the_spool_and_exits_4(private_spool: Path, tmp_path: Path) -> None:
    res = invoke(CliRunner(), "db", "flush", "--db", "postgresql://drill@127.0.0.1:9/nowhere?connect_timeout=2")
    assert res.exit_code == 4


# -- 3. many drills at once -------------------------------------------------------------------
def _concurrent(demo_run: Path, db: str, n: int) -> list[subprocess.CompletedProcess]:
    def one(_: int) -> subprocess.CompletedProcess:
        return subprocess.run(
            [DRILL, "run", "--root", str(demo_run), "--db", db, "--no-replay", "-q"],
            capture_output=True,
            text=True,
            timeout=300,
        )

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def test_n_drills_of_one_checkpoint_at_once_are_all_recorded(demo_run: Path, db_url: str) -> None:
    done = _concurrent(demo_run, db_url, 4)
    assert [d.returncode for d in done] == [0] * 4, [d.stderr for d in done]
    assert not any("locked" in d.stderr for d in done)
    drills = history(db=db_url)
    assert len(drills) == 4 and all(d.status == "passed" for d in drills)
    assert len({d.checkpoint.uri for d in drills if d.checkpoint}) == 1
    coverage = invoke(CliRunner(), "verify", str(sorted(demo_run.glob("step-*"))[-1]), "--db", db_url)
    assert coverage.exit_code == 0 and "100% of this checkpoint's bytes verified" in coverage.stdout


# -- 4. resource limits -----------------------------------------------------------------------
def test_a_checkpoint_larger_than_the_memory_budget_is_refused_before_loading(demo_run: Path, sqlite_url: str) -> None:
    outcome = _drill(demo_run, sqlite_url, memory_budget=64 * 1024)
    assert outcome.status.value == "error"
    assert "needs" in (outcome.message or "") and "available" in (outcome.message or "")
    (drilled,) = history(db=sqlite_url)
    assert drilled.status == "error"


def test_no_file_descriptor_or_thread_leaks_across_a_hundred_drills(demo_run: Path, sqlite_url: str) -> None:
    """A scheduler process runs drill after drill: what one leaves open, a hundred exhaust."""

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    for _ in range(3):  # warm: imports, the connection pool, the reader pool's first threads
        _drill(demo_run, sqlite_url)
    before = (fds(), threading.active_count())
    for _ in range(100):
        assert _drill(demo_run, sqlite_url).status.value == "passed"
    deadline = time.monotonic() + 10  # reader threads finishing their last task: wait for it, not a clock
    while threading.active_count() > before[1] + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    after = (fds(), threading.active_count())
    assert after[0] <= before[0] + 2, f"file descriptors {before[0]} → {after[0]}"
    assert after[1] <= before[1] + 1, f"threads {before[1]} → {after[1]}"
    assert len(history(db=sqlite_url, limit=1000)) == 103


def test_scratch_space_is_cleaned_on_every_exit_path(
    demo_run: Path, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drill restores into memory and stages nothing on disk; whatever a replay puts in the
    temporary directory goes with it, whether the replay passes or dies."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    from drill.replay import ReplaySpec

    _drill(demo_run, sqlite_url, replay=ReplaySpec(enabled=True, steps=1))
    _drill(
        demo_run,
        sqlite_url,
        replay=ReplaySpec(enabled=True, steps=1, entrypoint="tests.support.replay_targets:raising"),
    )
    assert list(scratch.iterdir()) == []


def test_a_spooled_file_claimed_by_another_flush_while_listed_is_not_rejected(
    private_spool: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four flushes at once: one lists a file another has just claimed (renamed). That file is
    not "unreadable" — it is someone else's delivery — and must not turn the flush into exit 1."""
    import os as _os

    from drill.records.spool import Spool

    spool = Spool("sqlite:///x.db")
    path = spool.put({"id": None, "pid": 1})
    real = _os.lstat

    def claimed_meanwhile(p, *a, **k):
        if str(p) == str(path) and path.exists():
            path.rename(str(path) + ".claimed-424242")  # the other flush's claim, between listing and examining
        return real(p, *a, **k)

    monkeypatch.setattr(_os, "lstat", claimed_meanwhile)
    pending = spool.pending()
    assert str(path) not in {str(p) for p in pending.rejected}
