"""The coverage ledger has two writers — the record store (any database, through SQLAlchemy) and
the sqlite3 one ``drill verify`` uses on the embedded file — and they must be one ledger: the
same rows, the same shares, each reading what the other wrote."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from drill.integrity.coverage import CoverageUpdate
from drill.records.db import open_database
from drill.records.ledgers import open_ledger
from drill.records.lite import SqliteLedger
from drill.records.store import Records
from drill.records.urls import SCHEMA_HEAD
from tests.conftest import fresh_python, invoke

SEALED = {"a.distcp": (600, "aa" * 16), "b.distcp": (300, "bb" * 16), ".metadata": (100, "mm" * 16)}
STEPS = [  # (files verified, files broken): a drill's outcomes in turn
    ({"a.distcp", ".metadata"}, set()),
    ({"b.distcp"}, set()),
    (set(), {"a.distcp"}),
    ({"a.distcp", "b.distcp", ".metadata"}, set()),
]


def _update(verified: set[str], broken: set[str]) -> CoverageUpdate:
    return CoverageUpdate(sealed=SEALED, verified={p: SEALED[p] for p in verified}, broken=frozenset(broken))


def _fresh(tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    open_database(str(path)).close()  # created and at head
    return str(path)


def _rows(path: str) -> tuple[list[tuple], list[tuple]]:
    with sqlite3.connect(path) as conn:
        ckpts = conn.execute(
            "SELECT id, run_root, uri, step, format, bytes, file_count, proofs_fingerprint, proofs_verified_at IS NULL "
            "FROM checkpoints ORDER BY id"
        ).fetchall()
        files = conn.execute(
            "SELECT checkpoint_id, path, size, xxh3_128, drill_id FROM file_verifications ORDER BY path"
        ).fetchall()
    return ckpts, files


def _play(ledger, uri: str) -> list[float]:
    cid = ledger.ensure_checkpoint(run_root="/runs/r", uri=uri, step=30, format="dcp")
    assert ledger.ensure_checkpoint(run_root="/runs/r", uri=uri, step=30, format="dcp") == cid
    return [ledger.apply_coverage(cid, None, _update(v, b), 7.0) for v, b in STEPS]


def test_both_writers_leave_the_same_rows_and_shares(tmp_path: Path) -> None:
    orm_db, lite_db = _fresh(tmp_path, "orm.db"), _fresh(tmp_path, "lite.db")
    database = open_database(orm_db)
    try:
        orm_shares = _play(Records(database), "/runs/r/step-30")
    finally:
        database.close()
    lite = SqliteLedger.at_head(lite_db)
    assert lite is not None
    try:
        lite_shares = _play(lite, "/runs/r/step-30")
    finally:
        lite.close()
    assert orm_shares == lite_shares == [0.7, 1.0, 0.4, 1.0]
    assert _rows(orm_db) == _rows(lite_db)


def test_each_reads_what_the_other_wrote(tmp_path: Path) -> None:
    path = _fresh(tmp_path, "shared.db")
    lite = SqliteLedger.at_head(path)
    assert lite is not None
    cid = lite.ensure_checkpoint(run_root="/runs/r", uri="/runs/r/step-30", step=30, format="dcp")
    lite.apply_coverage(cid, None, _update({"a.distcp"}, set()), 7.0)
    database = open_database(path)
    try:
        records = Records(database)
        by_orm = records.last_verified(records.checkpoint_id("/runs/r/step-30"))
        assert set(by_orm) == {"a.distcp"} and by_orm["a.distcp"][1] == "aa" * 16
        assert abs(by_orm["a.distcp"][0] - datetime.now(timezone.utc)) < timedelta(minutes=1)
        assert by_orm == lite.last_verified(cid)  # the same instant, to the microsecond
        records.apply_coverage(cid, None, _update({"b.distcp"}, set()), 7.0)
    finally:
        database.close()
    assert set(lite.last_verified(cid)) == {"a.distcp", "b.distcp"}
    assert lite.apply_coverage(cid, None, _update(set(), set()), 7.0) == 0.9
    lite.close()


def test_stale_proofs_do_not_count(tmp_path: Path) -> None:
    path = _fresh(tmp_path, "stale.db")
    lite = SqliteLedger.at_head(path)
    assert lite is not None
    cid = lite.ensure_checkpoint(run_root="/runs/r", uri="/runs/r/step-30", step=30, format="dcp")
    lite.apply_coverage(cid, None, _update(set(SEALED), set()), 7.0)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE file_verifications SET verified_at = '2020-01-01 00:00:00.000000' WHERE path = 'a.distcp'")
    assert lite.apply_coverage(cid, None, _update(set(), set()), 7.0) == 0.4
    lite.close()


@pytest.mark.parametrize("writer", ["records", "sqlite3"])
def test_a_damaged_proof_proves_nothing_and_is_rewritten(tmp_path: Path, writer: str) -> None:
    """A proof whose time cannot be read (a damaged row) makes its file due first; it never
    fails the drill or the verification that reads it."""
    path = _fresh(tmp_path, "damaged.db")
    database = open_database(path) if writer == "records" else None
    ledger = Records(database) if database is not None else SqliteLedger.at_head(path)
    assert ledger is not None
    try:
        cid = ledger.ensure_checkpoint(run_root="/runs/r", uri="/runs/r/step-30", step=30, format="dcp")
        ledger.apply_coverage(cid, None, _update(set(SEALED), set()), 7.0)
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE file_verifications SET verified_at = 'garbage' WHERE path = 'a.distcp'")
        assert ledger.last_verified(cid)["a.distcp"][0] == datetime.min.replace(tzinfo=timezone.utc)  # due first
        assert ledger.apply_coverage(cid, None, _update(set(), set()), 7.0) == 0.4
        assert ledger.apply_coverage(cid, None, _update({"a.distcp"}, set()), 7.0) == 1.0
    finally:
        if database is not None:
            database.close()
        else:
            ledger.close()


def test_the_light_ledger_is_used_only_on_an_sqlite_file_at_head(tmp_path: Path) -> None:
    new = tmp_path / "new.db"
    ledger = open_ledger(str(new))  # not there yet: the full path creates it at head
    assert not isinstance(ledger, SqliteLedger)
    ledger.close()
    ledger = open_ledger(str(new))
    assert isinstance(ledger, SqliteLedger)
    ledger.close()
    behind = tmp_path / "behind.db"
    from alembic import command
    from sqlalchemy import create_engine

    from drill.records.db import alembic_config

    engine = create_engine(f"sqlite:///{behind}")
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0006")  # a file written by the drill before
    engine.dispose()
    ledger = open_ledger(f"sqlite:///{behind}")  # upgraded through Alembic, not written as it is
    assert not isinstance(ledger, SqliteLedger)
    ledger.close()
    with sqlite3.connect(behind) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone()[0] == SCHEMA_HEAD


@pytest.mark.postgres
def test_postgresql_goes_through_the_record_store(postgres_url: str) -> None:
    from drill.records.db import upgrade

    upgrade(postgres_url)
    ledger = open_ledger(postgres_url)
    try:
        assert not isinstance(ledger, SqliteLedger)
        assert _play(ledger, "/runs/r/step-30") == [0.7, 1.0, 0.4, 1.0]
    finally:
        ledger.close()


def test_verify_keeps_the_ledger_without_importing_sqlalchemy(demo_run: Path, tmp_path: Path, cli) -> None:
    ckpt = sorted(demo_run.glob("step-*"))[-1]
    db = tmp_path / "v.db"
    assert invoke(cli, "verify", str(ckpt), "--db", str(db)).exit_code == 0  # first use: created through Alembic
    code = (
        "import sys\n"
        "from drill.cli.app import app\n"
        "from typer.testing import CliRunner\n"
        f"r = CliRunner().invoke(app, ['verify', {str(ckpt)!r}, '--db', {str(db)!r}])\n"
        "assert r.exit_code == 0, r.output\n"
        "assert '100% of this checkpoint' in r.output, r.output\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'alembic', 'torch')))\n"
    )
    assert fresh_python(code) == "[]"
    stamps = set(_times(str(db)).values())
    assert all(
        datetime.fromisoformat(stamp) > datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(minutes=5)
        for stamp in stamps
    )  # the second run made its proofs


def _times(path: str) -> dict[str, str]:
    """Each proof's time: the later of its row's and its checkpoint's sweep."""
    with sqlite3.connect(path) as conn:
        return dict(
            conn.execute(
                "SELECT f.path, max(f.verified_at, coalesce(c.proofs_verified_at, '')) "
                "FROM file_verifications f JOIN checkpoints c ON c.id = f.checkpoint_id"
            ).fetchall()
        )


@pytest.mark.parametrize("writer", ["records", "sqlite3"])
def test_a_nightly_reverify_redates_every_proof_and_a_resealed_file_is_rewritten(tmp_path: Path, writer: str) -> None:
    """The common night: every file proven again, of the same bytes — each proof re-dated (in
    one statement); then a file sealed anew (other bytes, other size) — its proof rewritten,
    the rest re-dated; then one that is new beside them. Both writers leave the same rows."""
    path = _fresh(tmp_path, f"{writer}.db")
    database = open_database(path) if writer == "records" else None
    ledger = Records(database) if database is not None else SqliteLedger.at_head(path)
    assert ledger is not None
    resealed = SEALED | {"a.distcp": (700, "a2" * 16)}
    grown = resealed | {"c.distcp": (200, "cc" * 16)}
    try:
        cid = ledger.ensure_checkpoint(run_root="/runs/r", uri="/runs/r/step-30", step=30, format="dcp")
        assert ledger.apply_coverage(cid, None, _update(set(SEALED), set()), 7.0) == 1.0
        first = _times(path)
        with sqlite3.connect(path) as conn:  # a week ago: only a re-dating makes them fresh again
            conn.execute("UPDATE file_verifications SET verified_at = '2020-01-01 00:00:00.000000'")
        assert ledger.apply_coverage(cid, None, _update(set(SEALED), set()), 7.0) == 1.0
        redated = _times(path)
        assert set(redated) == set(first) and all(t > "2021" for t in redated.values())
        update = CoverageUpdate(sealed=resealed, verified=dict(resealed), broken=frozenset())
        assert ledger.apply_coverage(cid, None, update, 7.0) == 1.0
        update = CoverageUpdate(sealed=grown, verified={"c.distcp": grown["c.distcp"]}, broken=frozenset())
        assert ledger.apply_coverage(cid, None, update, 7.0) == 1.0
    finally:
        if database is not None:
            database.close()
        else:
            ledger.close()
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT path, size, xxh3_128, drill_id FROM file_verifications ORDER BY path").fetchall()
    assert rows == [
        (".metadata", 100, "mm" * 16, None),
        ("a.distcp", 700, "a2" * 16, None),
        ("b.distcp", 300, "bb" * 16, None),
        ("c.distcp", 200, "cc" * 16, None),
    ]


def test_the_share_after_a_full_proof_is_the_one_every_proof_counted_gives() -> None:
    """Where every sealed file was just proven the share is 1.0 without a look at the stored
    rows; every other case counts them. Both answers are the full count's."""
    from drill.integrity.coverage import fresh_share, ledger_writes, proofs_after, share_after

    now = datetime(2026, 12, 3, tzinfo=timezone.utc)
    sealed = {f"f{i}": (100 + i, f"d{i}") for i in range(6)}
    old, recent = (now - timedelta(days=30)).isoformat(), (now - timedelta(days=1)).isoformat()
    rows = [(p, s, d, recent if i % 2 else old) for i, (p, (s, d)) in enumerate(sealed.items())]
    rows.append(("gone", 5, "dx", recent))  # a proof of a file no longer sealed
    updates = [
        CoverageUpdate(sealed, dict(sealed), frozenset()),  # everything, as sealed
        CoverageUpdate(sealed, dict(list(sealed.items())[:3]), frozenset()),  # a sample
        CoverageUpdate(sealed, dict(list(sealed.items())[:3]), frozenset({"f4"})),  # a sample, one broken
        CoverageUpdate(sealed, {}, frozenset()),  # nothing proven this time
        CoverageUpdate({}, {}, frozenset()),  # nothing sealed
    ]
    for update in updates:
        stored = {p: (s, d) for p, s, d, _ in rows}
        writes = ledger_writes(update, stored)
        parse = datetime.fromisoformat
        for days in (0.0, 7.0, 60.0):
            counted = fresh_share(
                update,
                proofs_after(update, {p: (d, at) for p, _, d, at in rows}, writes, now, parse),
                now - timedelta(days=days),
            )
            assert share_after(update, rows, writes, now, parse, days) == counted, (update.verified.keys(), days)
    same = {p: (s, d) for p, (s, d) in sealed.items()}
    writes = ledger_writes(CoverageUpdate(sealed, dict(sealed), frozenset()), same)
    assert writes.redate_all and writes.write == [] and writes.forget == []  # an unchanged checkpoint: one statement


def _held(path: str) -> list[tuple[str | None, str]]:
    """Each checkpoint's fingerprint as kept, and as its rows are now."""
    from drill.integrity.coverage import proofs_fingerprint

    with sqlite3.connect(path) as conn:
        out = []
        for cid, kept in conn.execute("SELECT id, proofs_fingerprint FROM checkpoints ORDER BY id").fetchall():
            rows = conn.execute("SELECT path, size, xxh3_128 FROM file_verifications WHERE checkpoint_id = ?", (cid,))
            out.append((kept, proofs_fingerprint({p: (size, d) for p, size, d in rows})))
    return out


def _statements(ledger, sink: list[str]) -> None:
    """Every statement ``ledger`` sends from now on, into ``sink``."""
    if isinstance(ledger, SqliteLedger):
        ledger.conn.set_trace_callback(sink.append)
        return
    from sqlalchemy import event

    event.listen(ledger.db.engine, "before_cursor_execute", lambda conn, cur, sql, *a: sink.append(sql))


@pytest.mark.parametrize("writer", ["records", "sqlite3"])
def test_the_fingerprint_is_kept_by_every_write_and_an_unchanged_checkpoint_touches_no_proof_row(
    tmp_path: Path, writer: str
) -> None:
    """After every write the checkpoint's fingerprint is its rows' (a stale one would let a
    verification skip proofs it must write); a verification that made exactly the proofs held
    re-dates them by its checkpoint's row alone — no statement reads or writes a proof — and
    every reader then sees the new time."""
    path = _fresh(tmp_path, f"{writer}.db")
    database = open_database(path) if writer == "records" else None
    ledger = Records(database) if database is not None else SqliteLedger.at_head(path)
    assert ledger is not None
    try:
        cid = ledger.ensure_checkpoint(run_root="/runs/r", uri="/runs/r/step-30", step=30, format="dcp")
        for verified, broken in [*STEPS, (set(SEALED), set()), (set(), {"b.distcp"}), (set(SEALED), set())]:
            ledger.apply_coverage(cid, None, _update(verified, broken), 7.0)
            ((kept, now),) = _held(path)
            assert kept == now
        with sqlite3.connect(path) as conn:  # a week ago: only the sweep makes them fresh again
            conn.execute("UPDATE file_verifications SET verified_at = '2020-01-01 00:00:00.000000'")
            conn.execute("UPDATE checkpoints SET proofs_verified_at = '2020-01-01 00:00:00.000000'")
        assert ledger.apply_coverage(cid, None, _update(set(SEALED), set()), 7.0) == 1.0
        sent: list[str] = []
        _statements(ledger, sent)
        assert ledger.apply_coverage(cid, None, _update(set(SEALED), set()), 7.0) == 1.0
        assert sent and not [q for q in sent if "file_verifications" in q], sent
        week_ago = datetime.now(timezone.utc) - timedelta(days=7)
        assert all(when > week_ago for when, _ in ledger.last_verified(cid).values())
        with sqlite3.connect(path) as conn:
            assert conn.execute("SELECT max(verified_at) FROM file_verifications").fetchone()[0] < "2021"
        if database is not None:  # the report's reader: the sweep's time too
            (ledger_rows,) = Records(database).ledger("/runs/r").values()
            assert len(ledger_rows) == len(SEALED) and all(v.at > week_ago for v in ledger_rows)
    finally:
        if database is not None:
            database.close()
        else:
            ledger.close()


def test_a_downgrade_writes_the_sweeps_time_into_each_proof_it_covers(tmp_path: Path) -> None:
    from alembic import command
    from sqlalchemy import create_engine

    from drill.records.db import alembic_config

    path = _fresh(tmp_path, "down.db")
    ledger = SqliteLedger.at_head(path)
    assert ledger is not None
    cid = ledger.ensure_checkpoint(run_root="/runs/r", uri="/runs/r/step-30", step=30, format="dcp")
    ledger.apply_coverage(cid, None, _update(set(SEALED), set()), 7.0)
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE file_verifications SET verified_at = '2020-01-01 00:00:00.000000' WHERE path != 'b.distcp'"
        )
        conn.execute("UPDATE file_verifications SET verified_at = '2030-01-01 00:00:00.000000' WHERE path = 'b.distcp'")
    ledger.apply_coverage(cid, None, _update(set(SEALED), set()), 7.0)  # the sweep
    swept = _times(path)
    ledger.close()
    engine = create_engine(f"sqlite:///{path}")
    try:
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0012")
    finally:
        engine.dispose()
    with sqlite3.connect(path) as conn:
        assert dict(conn.execute("SELECT path, verified_at FROM file_verifications").fetchall()) == swept
    assert swept["b.distcp"].startswith("2030") and swept["a.distcp"] > "2026"


@pytest.mark.postgres
def test_on_postgresql_an_unchanged_checkpoint_is_re_dated_by_its_row_alone(postgres_url: str) -> None:
    from drill.records.db import upgrade

    upgrade(postgres_url)
    database = open_database(postgres_url)
    ledger = Records(database)
    try:
        cid = ledger.ensure_checkpoint(run_root="/runs/r", uri="/runs/r/step-sweep", step=30, format="dcp")
        assert ledger.apply_coverage(cid, None, _update(set(SEALED), set()), 7.0) == 1.0
        first = ledger.last_verified(cid)
        sent: list[str] = []
        _statements(ledger, sent)
        assert ledger.apply_coverage(cid, None, _update(set(SEALED), set()), 7.0) == 1.0
        assert sent and not [q for q in sent if "file_verifications" in q], sent
        again = ledger.last_verified(cid)
        assert again.keys() == first.keys() and all(again[p][0] > first[p][0] for p in first)
        (rows,) = [v for uri, v in ledger.ledger("/runs/r").items() if uri == "/runs/r/step-sweep"]
        assert sorted(v.at for v in rows) == sorted(t for t, _ in again.values())
    finally:
        database.close()
