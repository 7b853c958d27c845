"""The drill pipeline: one verdict rule, and a record that is closed whatever happens to it."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from drill import DrillOutcome, DrillRequest, get_drill, history, run_drill
from drill.errors import DatabaseError
from drill.findings import CheckStatus
from drill.pipeline import NullRecorder
from drill.replay import ReplaySpec
from tests.conftest import drill
from tests.support.faults import Fail, FaultyStorage, Flip, Grow, Truncate
from tests.test_formats import rewrite_dcp

ORDER = ["discover", "resume", "integrity", "durable", "files", "load", "keys", "contract", "replay"]


def _recorded(db: str, outcome: DrillOutcome) -> dict[str, Any]:
    """The record as ``drill show --json`` prints it, less its seal (checked: intact)."""
    doc = get_drill(outcome.id, db=db).to_document()
    assert doc.pop("seal")["state"] == "intact"
    return doc


# -- one verdict rule -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("drop", "check", "code"),
    [
        (lambda s: [s.pop(k) for k in [k for k in s if k.startswith("rng.")]], "keys", "part-missing"),
        (lambda s: [s.pop(k) for k in [k for k in s if k.startswith("dataloader.")]], "keys", "part-missing"),
        (lambda s: [s.pop(k) for k in [k for k in s if k.startswith("lr_scheduler.")]], "keys", "part-missing"),
        (lambda s: s.pop("optimizer.state.head.weight.exp_avg"), "contract", "optimizer-slot-missing"),
        # drill.sdk's RNGState always saves numpy's generator: without it a replay errs (exit 5), a resume drifts
        (
            lambda s: [s.pop(k) for k in [k for k in s if k.startswith("rng.numpy.")]],
            "contract",
            "rng-generator-missing",
        ),
    ],
    ids=["no-rng", "no-dataloader", "no-lr_scheduler", "no-exp_avg", "no-numpy-rng"],
)
@pytest.mark.slow
def test_a_checkpoint_missing_a_part_fails_with_exit_1_even_with_the_replay_on(
    demo_run: Path, sqlite_url: str, drop, check: str, code: str
) -> None:
    rewrite_dcp(demo_run / "step-30", drop)
    outcome = drill(demo_run, sqlite_url, replay=ReplaySpec())
    assert (outcome.status, int(outcome.exit_code)) == ("failed", 1)
    assert code in [f.code for f in outcome.check(check).findings]
    replay = outcome.check("replay")
    assert replay is not None and replay.status in (CheckStatus.SKIPPED, CheckStatus.FAILED, CheckStatus.ERROR)
    if replay.status is CheckStatus.SKIPPED:
        assert "not replayable" in replay.summary and "failed" in replay.summary
    assert _recorded(sqlite_url, outcome)["status"] == "failed"


def test_every_drill_lists_every_check_and_why_one_did_not_run(tmp_path: Path) -> None:
    (tmp_path / "run" / "step-5").mkdir(parents=True)
    (tmp_path / "run" / "step-5" / "__0_0.distcp").write_bytes(b"partial")  # a run whose only save never finished
    outcome = run_drill(DrillRequest(root=str(tmp_path / "run")), recorder=NullRecorder())
    assert [c.name for c in outcome.checks] == ORDER
    assert (outcome.status, int(outcome.exit_code)) == ("failed", 3)
    assert outcome.check("discover").status is CheckStatus.FAILED
    skipped = [c for c in outcome.checks[2:]]
    assert all(
        c.status is CheckStatus.SKIPPED and c.summary.startswith("not checked: nothing to drill") for c in skipped
    )


@pytest.mark.parametrize(
    ("root", "selector", "error"),
    [
        ("absent", "latest", "NothingToDrill"),
        ("empty", "latest", "NothingToDrill"),
        ("run", "step:7", "NothingToDrill"),
        ("run", "latest", "UsageError"),
    ],
)
def test_a_mistake_is_raised_before_anything_is_recorded(
    demo_run: Path, tmp_path: Path, sqlite_url: str, root: str, selector: str, error: str
) -> None:
    """No such root, a run with nothing in it, a step that is not retained, a replay module that
    does not exist: each is raised before the record is opened, never an audit record."""
    from drill.errors import DrillError

    (tmp_path / "empty").mkdir()
    path = {"absent": tmp_path / "absent", "empty": tmp_path / "empty", "run": demo_run}[root]
    replay = (
        ReplaySpec(entrypoint="no_such_trainer.replay:build") if error == "UsageError" else ReplaySpec(enabled=False)
    )
    with pytest.raises(DrillError) as raised:
        run_drill(DrillRequest(root=str(path), selector=selector, replay=replay), db=sqlite_url)
    assert type(raised.value).__name__ == error
    assert history(db=sqlite_url) == []


def test_a_null_recorder_drill_records_nothing(demo_run: Path, sqlite_url: str) -> None:
    outcome = run_drill(DrillRequest(root=str(demo_run), replay=ReplaySpec(enabled=False)), recorder=NullRecorder())
    assert outcome.status == "passed" and outcome.id is None
    assert history(db=sqlite_url) == []


# -- a record closed for every fault --------------------------------------------------------
@pytest.mark.slow
def test_non_finite_replay_values_are_recorded_on_both_backends(demo_run: Path, db_url: str) -> None:
    outcome = drill(demo_run, db_url, replay=ReplaySpec(entrypoint="tests.support.replay_targets:nan_loss", steps=2))
    assert outcome.status == "failed" and outcome.record_problem is None
    (finding,) = outcome.check("replay").findings
    assert finding.code == "replay-diverged-loss"
    doc = _recorded(db_url, outcome)
    assert doc == outcome.to_document()
    assert [(s["loss"], s["grad_norm"]) for s in doc["replay"]["steps"]] == [("NaN", "Infinity")] * 2


def test_a_transient_write_failure_is_retried(demo_run: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from drill.records.store import Records

    real, calls = Records.finish_drill, []

    def flaky(self, outcome):
        calls.append(1)
        if len(calls) == 1:
            err = DatabaseError("database is locked")
            err.transient = True
            raise err
        return real(self, outcome)

    monkeypatch.setattr(Records, "finish_drill", flaky)
    outcome = drill(demo_run, sqlite_url)
    assert len(calls) == 2 and outcome.record_problem is None
    assert _recorded(sqlite_url, outcome)["status"] == "passed"


@pytest.fixture
def full_disk():
    """Every SQLite connection opened from now on may not grow its database: SQLITE_FULL
    ("database or disk is full"), exactly what a full disk gives."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    state = {"on": False}

    def cap(dbapi_conn, _record):
        if state["on"] and isinstance(dbapi_conn, sqlite3.Connection):
            pages = dbapi_conn.execute("PRAGMA page_count").fetchone()[0]
            dbapi_conn.execute(f"PRAGMA max_page_count = {pages}")

    event.listen(Engine, "connect", cap)
    yield state
    event.remove(Engine, "connect", cap)


def test_a_full_disk_closes_the_row_as_error_with_the_real_verdict(
    demo_run: Path, sqlite_url: str, full_disk, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("drill.records.recorder.BACKOFF", (0.01, 0.01))
    history(db=sqlite_url)  # the database exists, at its head revision
    drill(demo_run, sqlite_url)
    full_disk["on"] = True
    outcome = drill(demo_run, sqlite_url)
    assert outcome.status == "passed"  # the checkpoint's verdict stands …
    assert outcome.record_problem and "closed as error" in outcome.record_problem
    full_disk["on"] = False
    doc = _recorded(sqlite_url, outcome)  # … and the row is not left running
    assert doc["status"] == "error" and "the drill passed" in doc["message"] and "full" in doc["message"]


@pytest.mark.slow
def test_a_lock_held_past_the_busy_timeout_spools_the_verdict_for_the_next_drill(
    demo_run: Path, sqlite_url: str, private_spool: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRILL_SQLITE_BUSY_TIMEOUT", "0.1")
    monkeypatch.setattr("drill.records.recorder.BACKOFF", (0.01, 0.01))
    history(db=sqlite_url)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        holding.set()
        release.wait(60)
        conn.execute("ROLLBACK")
        conn.close()

    class LockAtChecks:
        def phase(self, name: str, total_bytes: int | None = None) -> None:
            if name == "checks":
                threading.Thread(target=hold, daemon=True).start()
                holding.wait(10)

        def advance(self, nbytes: int) -> None:
            pass

    outcome = drill(demo_run, sqlite_url, progress=LockAtChecks())
    release.set()
    assert outcome.status == "passed" and outcome.id is not None
    assert outcome.record_problem and "kept in" in outcome.record_problem
    (spooled,) = private_spool.glob("*.json")
    assert oct(spooled.stat().st_mode & 0o777) == "0o600"
    assert get_drill(outcome.id, db=sqlite_url).status == "running"  # not yet delivered …

    nxt = drill(demo_run, sqlite_url)  # … the next drill delivers it first, and no orphan recovery relabels it
    assert nxt.record_problem is None and not list(private_spool.glob("*.json"))
    delivered = _recorded(sqlite_url, outcome)
    assert delivered["status"] == "passed" and delivered["checks"] == outcome.to_document()["checks"]


@pytest.mark.slow
def test_a_database_away_when_the_drill_began_still_gets_the_drill(
    demo_run: Path, sqlite_url: str, private_spool: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from drill.records.store import Records

    history(db=sqlite_url)

    def away(*a, **k):
        raise DatabaseError("connection refused")

    monkeypatch.setattr(Records, "begin_drill", away)
    monkeypatch.setattr(Records, "insert_outcome", away)
    outcome = drill(demo_run, sqlite_url)
    assert outcome.status == "passed" and outcome.id is None and "kept in" in (outcome.record_problem or "")
    monkeypatch.undo()
    monkeypatch.setenv("DRILL_SPOOL_DIR", str(private_spool))
    drill(demo_run, sqlite_url)
    assert [d.status for d in history(db=sqlite_url)] == ["passed", "passed"]


# -- faults during the read -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("fault", "check", "code"),
    [
        (Flip(offset=4096), "integrity", "digest-mismatch"),
        (Truncate(at=1000), "files", "file-changed"),
        (Grow(extra=10), "files", "file-changed"),
        (Fail(at=2048), "files", "file-unreadable"),
    ],
    ids=["bit-flip", "truncated-while-read", "grew-while-read", "io-error-mid-file"],
)
@pytest.mark.slow
def test_faults_during_the_read_fail_the_drill_with_their_finding(
    demo_run: Path, sqlite_url: str, fault, check: str, code: str
) -> None:
    outcome = drill(demo_run, sqlite_url, storage=FaultyStorage({"__0_0.distcp": fault}))
    assert outcome.status == "failed"
    assert (code, "__0_0.distcp") in [(f.code, f.subject) for f in outcome.check(check).findings]
    assert _recorded(sqlite_url, outcome)["status"] == "failed"


def test_a_transient_io_error_is_retried_and_the_drill_passes(demo_run: Path, sqlite_url: str) -> None:
    storage = FaultyStorage({"__0_1.distcp": Fail(at=100, times=1)})
    outcome = drill(demo_run, sqlite_url, storage=storage)
    assert outcome.status == "passed" and storage.opens["__0_1.distcp"] == 2
    files = outcome.check("files").evidence["files"]
    assert next(f for f in files if f["path"] == "__0_1.distcp")["retries"] == 1


def test_the_public_api(demo_run: Path, sqlite_url: str) -> None:
    import drill as api

    assert {"run_drill", "DrillRequest", "DrillOutcome", "verify_checkpoint", "seal"} <= set(api.__all__)
    verified = api.verify_checkpoint(str(demo_run / "step-20"))
    assert verified.exit_code == 0 and "every byte matches" in verified.result.summary
    outcome = api.run_drill(
        api.DrillRequest(root=str(demo_run), selector="step:20", replay=ReplaySpec(enabled=False)), db=sqlite_url
    )
    assert outcome.status is api.DrillStatus.PASSED and outcome.exit_code is api.ExitCode.PASSED


@pytest.mark.slow
def test_a_read_that_never_returns_ends_the_drill_at_its_timeout(demo_run: Path, sqlite_url: str) -> None:
    import threading
    import time

    from tests.support.faults import Hang

    release = threading.Event()
    started = time.monotonic()
    try:
        outcome = drill(demo_run, sqlite_url, storage=FaultyStorage({"__0_1.distcp": Hang(release)}), timeout=2)
    finally:
        release.set()
    assert time.monotonic() - started < 10
    assert (outcome.status, int(outcome.exit_code)) == ("error", 5)
    assert outcome.message == "the drill ran past its 2 s timeout during restore"
    assert _recorded(sqlite_url, outcome)["status"] == "error"


@pytest.mark.slow
def test_no_checkpoint_file_is_ever_memory_mapped(
    demo_run: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file truncated while mapped kills the reader with SIGBUS: drill maps none."""
    import mmap

    real = mmap.mmap

    def anonymous_only(fileno, *a, **k):
        assert fileno == -1, "a checkpoint file was memory-mapped"
        return real(fileno, *a, **k)

    monkeypatch.setattr(mmap, "mmap", anonymous_only)
    assert drill(demo_run, sqlite_url, replay=ReplaySpec(steps=1)).status == "passed"
    from drill import verify_checkpoint

    assert verify_checkpoint(str(demo_run / "step-20")).exit_code == 0


def test_a_file_truncated_on_disk_during_the_drill_is_a_finding(demo_run: Path, sqlite_url: str) -> None:
    shard = demo_run / "step-30" / "__0_0.distcp"

    class TruncateWhenReading:
        def phase(self, name: str, total_bytes: int | None = None) -> None:
            if name == "read":  # DCP re-saving into the directory truncates its files
                with open(shard, "r+b") as f:
                    f.truncate(1000)

        def advance(self, nbytes: int) -> None:
            pass

    outcome = drill(demo_run, sqlite_url, progress=TruncateWhenReading())
    assert outcome.status == "failed"
    codes = {(f.check, f.code) for f in outcome.findings}
    assert ("integrity", "size-mismatch") in codes or ("files", "file-changed") in codes
