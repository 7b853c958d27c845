"""Records on real databases: Alembic migrations on SQLite and on the live PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from drill.errors import DatabaseError, ExitCode
from drill.findings import CheckResult, Finding, Severity
from drill.pipeline.outcome import CheckpointInfo, Timings
from drill.pipeline.recorder import DrillStart
from drill.records.db import alembic_config, head_revision, open_database, resolve_url, schema_status, upgrade
from drill.records.store import Records
from drill.verdict import DrillStatus

TABLES = {"alembic_version", "checkpoints", "drills", "check_results"}


def test_embedded_sqlite_upgrades_itself_on_first_use(sqlite_url: str) -> None:
    db = open_database(sqlite_url)
    assert TABLES <= set(inspect(db.engine).get_table_names())
    db.close()
    assert schema_status(sqlite_url).current == head_revision()


@pytest.mark.postgres
def test_postgres_behind_gives_a_clear_error_naming_the_command(postgres_url: str) -> None:
    with pytest.raises(DatabaseError, match=r"run `drill db upgrade"):
        open_database(postgres_url)
    before, after = upgrade(postgres_url)
    assert (before, after) == (None, head_revision())
    db = open_database(postgres_url)
    assert TABLES <= set(inspect(db.engine).get_table_names())
    db.close()


def test_migrations_downgrade_and_upgrade_again(db_url: str) -> None:
    from alembic import command

    engine = create_engine(resolve_url(db_url))
    with engine.begin() as conn:
        command.downgrade(alembic_config(conn), "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "head")
    assert TABLES <= set(inspect(engine).get_table_names())
    engine.dispose()


def test_schema_newer_than_drill_is_refused(sqlite_url: str) -> None:
    open_database(sqlite_url).close()
    engine = create_engine(sqlite_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    with pytest.raises(DatabaseError, match="newer than this drill knows"):
        open_database(sqlite_url)


def test_unreachable_database_is_one_line_without_the_password() -> None:
    with pytest.raises(DatabaseError) as info:
        open_database("postgresql://drill:s3cret@127.0.0.1:1/drill")
    assert "s3cret" not in info.value.message
    assert "\n" not in info.value.message


def _start(run_root: str = "/r") -> DrillStart:
    return DrillStart(
        run_root=run_root, selector="latest", trigger="manual", device="cpu", policy=None,
        started_at=datetime.now(timezone.utc), versions={"drill": "test", "torch": "x"},
    )  # fmt: skip


def test_drill_row_is_visible_while_running_and_completed_at_the_end(db_url: str) -> None:
    records = Records(open_database(db_url))
    drill_id = records.begin_drill(_start())
    running = records.get(drill_id)
    assert running.status is DrillStatus.RUNNING and running.finished_at is None

    ckpt = CheckpointInfo(uri="/r/step-3", name="step-3", step=3, format="dcp", bytes=100, files=2)
    records.attach_checkpoint(drill_id, ckpt, selection="latest", evidence_level="sealed", sample="all")
    finding = Finding(check="files", code="file-missing", severity=Severity.ERROR, subject="a.distcp", message="gone")
    records.add_checks(
        drill_id, [CheckResult(name="files", summary="1 missing", findings=[finding], evidence={"n": (1, 2)})]
    )
    outcome = records.get(drill_id)
    outcome.status, outcome.exit_code, outcome.message = DrillStatus.FAILED, ExitCode.FAILED, "gone"
    outcome.timings, outcome.bytes_read, outcome.finished_at = (
        Timings(restore=2.0, read=1.0, load=0.5),
        3000,
        datetime.now(timezone.utc),
    )
    records.finish_drill(outcome)

    doc = records.get(drill_id).to_document()
    assert doc["status"] == "failed" and doc["exit_code"] == 1 and doc["message"] == "gone"
    assert doc["checkpoint"] == {
        "uri": "/r/step-3",
        "name": "step-3",
        "step": 3,
        "format": "dcp",
        "bytes": 100,
        "files": 2,
    }
    assert doc["throughput_bps"] == pytest.approx(2000.0)
    assert doc["checks"][0]["evidence"] == {"n": [1, 2]}
    assert doc["checks"][0]["findings"] == [
        {"check": "files", "code": "file-missing", "severity": "error", "subject": "a.distcp", "message": "gone"}
    ]
    assert records.history()[0].started_at.utcoffset() == timezone.utc.utcoffset(None)
    records.db.close()


def test_checkpoint_rows_are_shared_between_drills(db_url: str) -> None:
    records = Records(open_database(db_url))
    ids = []
    for _ in range(2):
        d = records.begin_drill(_start())
        ckpt = CheckpointInfo(uri="/r/step-3", name="step-3", step=3, format="dcp", bytes=1, files=1)
        ids.append(records.attach_checkpoint(d, ckpt, selection="latest", evidence_level=None, sample=None))
    assert ids[0] == ids[1]
    assert len(records.history(run_root="/r")) == 2
    assert records.history(run_root="/elsewhere") == []
    records.db.close()


def test_datetimes_come_back_aware_in_utc(db_url: str) -> None:
    from sqlalchemy import select

    from drill.records.models import Drill

    db = open_database(db_url)
    records = Records(db)
    records.begin_drill(_start())
    with db.sessions() as s:
        started = s.scalars(select(Drill.started_at)).one()
    assert started.tzinfo is not None and started.utcoffset() == timezone.utc.utcoffset(None)
    db.close()


def test_default_location_is_per_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("DRILL_DATABASE_URL", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert resolve_url(None) == f"sqlite:///{tmp_path}/drill/drill.db"
    monkeypatch.setenv("DRILL_DATABASE_URL", "postgresql://db/drill")
    assert resolve_url(None) == "postgresql+psycopg://db/drill"
    assert resolve_url("relative.db").startswith("sqlite:////")


def test_the_schema_head_drill_checks_without_alembic_is_alembics_head() -> None:
    from drill.records.db import alembic_head

    assert head_revision() == alembic_head()


@pytest.mark.parametrize(
    "damage",
    [
        "UPDATE drills SET started_at = 'garbage'",
        "UPDATE drills SET status = 'bogus'",
        "UPDATE drills SET slo_breaches = '{not json'",
    ],
    ids=["time", "status", "json"],
)
@pytest.mark.slow
def test_a_record_edited_outside_drill_is_a_database_error(demo_run: Path, tmp_path: Path, damage: str) -> None:
    """Reading a row drill cannot turn back into a record names the database (exit 4), for
    the library and every reading command; it is never an internal error."""
    import sqlite3

    from typer.testing import CliRunner

    from drill.cli.app import app
    from tests.conftest import drill as run_one

    db = tmp_path / "d.db"
    outcome = run_one(demo_run, f"sqlite:///{db}")
    with sqlite3.connect(db) as conn:
        conn.execute(damage)
    database = open_database(str(db))
    try:
        records = Records(database)
        with pytest.raises(DatabaseError, match="cannot read"):
            records.get(outcome.id)
        with pytest.raises(DatabaseError, match="cannot read"):
            records.history()
    finally:
        database.close()
    for args in (["history"], ["show", str(outcome.id)], ["report", "--format", "json"]):
        result = CliRunner().invoke(app, [*args, "--db", str(db)])
        assert result.exit_code == ExitCode.DATABASE, (args, result.output)
        assert "cannot read" in result.output and "Traceback" not in result.output


def test_a_damaged_row_does_not_stop_the_next_drill(demo_run: Path, tmp_path: Path) -> None:
    """A drill left `running` with a time that is not a time (edited outside drill) cannot be
    recovered as an orphan; the next drill still runs, is recorded, and says what it skipped."""
    import sqlite3

    from tests.conftest import drill as run_one

    db = tmp_path / "d.db"
    first = run_one(demo_run, f"sqlite:///{db}")
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE drills SET status = 'running', started_at = 'garbage', process_start = NULL WHERE id = ?",
            (first.id,),
        )
    outcome = run_one(demo_run, f"sqlite:///{db}")
    assert outcome.status == DrillStatus.PASSED and outcome.id is not None and outcome.id != first.id
    assert "cannot read" in (outcome.record_problem or "")


def _drilled(records: Records, run_root: str, step: int, status: DrillStatus) -> int:
    drill_id = records.begin_drill(_start(run_root))
    ckpt = CheckpointInfo(uri=f"{run_root}/step-{step}", name=f"step-{step}", step=step, format="dcp", bytes=1, files=1)
    records.attach_checkpoint(drill_id, ckpt, selection="latest", evidence_level="sealed", sample="all")
    records.add_checks(drill_id, [CheckResult(name="files", summary="ok")])
    outcome = records.get(drill_id)
    outcome.status, outcome.finished_at = status, datetime.now(timezone.utc)
    records.finish_drill(outcome)
    return drill_id


@pytest.mark.parametrize("readers", ["sources", "latest_drills", "outcomes", "history"])
def test_reading_outcomes_costs_the_same_statements_for_two_drills_or_many(db_url: str, readers: str) -> None:
    """Every reader of whole outcomes loads each relation an outcome reads (its checkpoint,
    alerts, checks, replay) for all its drills at once: the statements it sends do not grow
    with the drills it returns (one lazy load per drill made a week of metrics a query per row)."""
    from sqlalchemy import event

    def statements(records: Records, root: str) -> int:
        sent: list[str] = []
        listener = lambda *args: sent.append(args[2])  # noqa: E731 - (conn, cursor, statement, ...)
        event.listen(records.db.engine, "before_cursor_execute", listener)
        try:
            if readers == "sources":
                latest, _ = records.sources()
                assert all(last is not None and last.alerts == [] for last, _ in latest.values())
            elif readers == "latest_drills":
                assert len(records.latest_drills(root)) > 1
            elif readers == "outcomes":
                assert len(records.outcomes([b.id for b in records.briefs_in_window(since=None, run_root=root)])) > 1
            else:
                assert len(records.history(run_root=root, limit=1000)) > 1
        finally:
            event.remove(records.db.engine, "before_cursor_execute", listener)
        return len(sent)

    records = Records(open_database(db_url))
    counts = []
    for root, drills in (("/few", 2), ("/many", 9)):
        for i in range(drills):
            drill_id = _drilled(records, root, i, DrillStatus.PASSED if i % 3 else DrillStatus.FAILED)
            records.record_alerts(drill_id, [])
        counts.append(statements(records, root))
    assert counts[0] == counts[1], f"{readers}: {counts[0]} statements for 2 drills, {counts[1]} for 9"
    records.db.close()
