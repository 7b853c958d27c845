"""The tamper-evident drill log, on SQLite and the live PostgreSQL: every way of editing the
record after the fact is named by ``drill audit verify``."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from drill.records.db import open_database
from tests.conftest import drill, invoke
from tests.support.faults import FaultyStorage, Flip


def _sql(url: str, *statements: str) -> None:
    db = open_database(url)
    try:
        with db.engine.begin() as conn:
            for statement in statements:
                conn.execute(sa.text(statement))
    finally:
        db.close()


def _verify(url: str, *extra: str):
    res = invoke(CliRunner(), "audit", "verify", "--db", url, "--json", *extra)
    return res.exit_code, json.loads(res.stdout)


def _codes(doc: dict) -> list[tuple[str, str]]:
    return [(p["code"], p["subject"]) for p in doc["problems"]]


def _flipped() -> FaultyStorage:
    return FaultyStorage({"__0_0.distcp": Flip(offset=4096)})


@pytest.fixture
def three_drills(demo_run: Path, db_url: str) -> str:
    """Three closed drills: passed, failed (a flipped byte), passed."""
    assert drill(demo_run, db_url).status == "passed"
    assert drill(demo_run, db_url, storage=_flipped()).status == "failed"
    assert drill(demo_run, db_url, "step:20").status == "passed"
    return db_url


@pytest.mark.slow
def test_an_untouched_log_is_intact_and_names_its_head(three_drills: str) -> None:
    code, doc = _verify(three_drills)
    assert code == 0 and doc["intact"] and doc["entries"] == 3 and doc["records"] == 3
    assert doc["head"]["seq"] == 3 and doc["head"]["drill_id"] == 3 and len(doc["head"]["hash"]) == 64
    for again in ([], ["--full"]):  # every pass is a full one; --full is still accepted
        res = invoke(CliRunner(), "audit", "verify", "--db", three_drills, *again)
        assert res.exit_code == 0 and res.stdout.startswith(
            f"audit chain intact: 3 entries, 3 records match; head {doc['head']['hash']}"
        )


@pytest.mark.parametrize(
    "edit",
    [
        "UPDATE drills SET status = 'passed', exit_code = 0 WHERE id = 2",  # the failure hidden
        "UPDATE drills SET restore_seconds = restore_seconds / 10 WHERE id = 2",  # a faster restore
        {  # a check's summary rewritten
            "sqlite": "UPDATE drills SET details = json_set(details, '$.checks[2].summary', 'fine') WHERE id = 2",
            "postgresql": "UPDATE drills SET details = jsonb_set(details, '{checks,2,summary}', '\"fine\"') WHERE id = 2",
        },
        {  # a check removed
            "sqlite": "UPDATE drills SET details = json_remove(details, '$.checks[2]') WHERE id = 2",
            "postgresql": "UPDATE drills SET details = details #- '{checks,2}' WHERE id = 2",
        },
        "UPDATE drills SET checkpoint_id = (SELECT MAX(id) FROM checkpoints) WHERE id = 2",
        # a row of the tables drills before 0.6 kept their checks in, put beside a record
        "INSERT INTO check_results (drill_id, name, status, summary, evidence, seconds) VALUES (2, 'integrity', 'passed', 'fine', '{}', 0.1)",
    ],
    ids=["status", "latency", "check-summary", "check-removed", "checkpoint", "check-row-added"],
)
@pytest.mark.slow
def test_an_edited_record_is_named(three_drills: str, edit: str | dict) -> None:
    if isinstance(edit, dict):
        edit = edit["postgresql" if three_drills.startswith("postgresql") else "sqlite"]
    _sql(three_drills, edit)
    code, doc = _verify(three_drills)
    assert code == 1 and not doc["intact"]
    assert _codes(doc) == [("record-edited", "drill #2")]


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        ("UPDATE drills SET started_at = 'garbage' WHERE id = 2", [("record-edited", "drill #2")]),
        (
            "UPDATE drills SET details = '{broken' WHERE id = 2",
            [("record-edited", "drill #2")],
        ),
        ("UPDATE audit_log SET sealed_at = 'garbage' WHERE seq = 2", [("entry-edited", "entry 2")]),
    ],
    ids=["time", "json", "entry-time"],
)
@pytest.mark.slow
def test_a_value_that_cannot_be_read_is_an_edit_not_a_crash(
    demo_run: Path, sqlite_url: str, edit: str, expected: list
) -> None:
    """SQLite stores what it is given: a time that is not a time is named like any other edit,
    and every other record and entry is still checked."""
    for _ in range(3):
        assert drill(demo_run, sqlite_url).status == "passed"
    _sql(sqlite_url, edit)
    code, doc = _verify(sqlite_url)
    assert code == 1 and not doc["intact"]
    assert _codes(doc) == expected
    assert doc["entries"] == 3 and doc["records"] == 2


@pytest.mark.slow
def test_an_edited_replay_step_is_named(demo_run: Path, db_url: str) -> None:
    from drill.replay import ReplaySpec

    drill(demo_run, db_url, replay=ReplaySpec(steps=2))
    _sql(
        db_url,
        "UPDATE drills SET details = jsonb_set(details, '{replay_steps,0,loss}', "
        "to_jsonb((details->'replay_steps'->0->>'loss')::float + 0.001)) WHERE id = 1"
        if db_url.startswith("postgresql")
        else "UPDATE drills SET details = json_set(details, '$.replay_steps[0].loss', "
        "json_extract(details, '$.replay_steps[0].loss') + 0.001) WHERE id = 1",
    )
    assert _codes(_verify(db_url)[1]) == [("record-edited", "drill #1")]


@pytest.mark.slow
def test_deleted_reordered_and_inserted_records_are_named(three_drills: str) -> None:
    _sql(three_drills, "DELETE FROM check_results WHERE drill_id = 2", "DELETE FROM drills WHERE id = 2")
    assert _codes(_verify(three_drills)[1]) == [("record-deleted", "drill #2")]

    _sql(
        three_drills,
        "UPDATE audit_log SET seq = 99 WHERE seq = 1",
        "UPDATE audit_log SET seq = 1 WHERE seq = 3",
        "UPDATE audit_log SET seq = 3 WHERE seq = 99",
    )
    codes = _codes(_verify(three_drills)[1])
    assert ("link-broken", "entry 1 (drill #3)") in codes and ("link-broken", "entry 3 (drill #1)") in codes


@pytest.mark.slow
def test_a_deleted_entry_and_a_record_inserted_behind_drills_back(three_drills: str) -> None:
    _sql(three_drills, "DELETE FROM audit_log WHERE seq = 2")
    assert _codes(_verify(three_drills)[1]) == [("entries-missing", "entry 3"), ("record-unsealed", "drill #2")]


@pytest.mark.slow
@pytest.mark.parametrize("head", ["zz", "ab" * 31 + "a", "g" * 64, "ab" * 33])
def test_a_pinned_head_that_cannot_be_one_is_a_usage_error_not_a_rewritten_log(three_drills: str, head: str) -> None:
    """``--head zz`` said "the log was rewritten or its newest entries deleted" (exit 1): a pin
    that is no SHA-256 proves nothing about the log. Exit 2, one line; the intact log still is."""
    res = invoke(CliRunner(), "audit", "verify", "--head", head, "--db", three_drills)
    assert res.exit_code == 2 and f"--head {head!r} is not a chain head" in res.stderr, res.stderr
    code, doc = _verify(three_drills, "--head", _verify(three_drills)[1]["head"]["hash"].upper())
    assert code == 0 and doc["intact"]  # a real head, in either case, still pins


def test_truncating_the_newest_records_is_caught_by_a_pinned_head(three_drills: str) -> None:
    _, before = _verify(three_drills)
    pinned = before["head"]["hash"]
    _sql(
        three_drills,
        "DELETE FROM check_results WHERE drill_id = 3",
        "DELETE FROM drills WHERE id = 3",
        "DELETE FROM audit_log WHERE seq = 3",
    )
    code, doc = _verify(three_drills)
    assert code == 0 and doc["entries"] == 2  # consistent on its own: that is what the pin is for
    code, doc = _verify(three_drills, "--head", pinned)
    assert code == 1 and _codes(doc) == [("head-missing", pinned)]


def _rewrite_chain(url: str) -> None:
    """What someone with write access but no key could do: edit a record, then recompute its
    digest and every hash after it."""
    from drill.records import audit

    _sql(url, "UPDATE drills SET status = 'passed', exit_code = 0, message = NULL WHERE id = 2")
    db = open_database(url)
    try:
        with db.sessions.begin() as s:
            entries = list(s.scalars(sa.select(audit.AuditEntry).order_by(audit.AuditEntry.seq)))
            digests = audit.record_digests(s, [e.drill_id for e in entries])
            prev = audit.GENESIS
            for e in entries:
                e.content_sha256 = digests[e.drill_id]
                e.prev_hash = prev
                e.hash = hashlib.sha256(_message(e)).hexdigest()
                prev = e.hash
    finally:
        db.close()


def _message(e) -> bytes:  # type: ignore[no-untyped-def]
    from datetime import timezone

    from drill.records import audit

    return audit._message(
        e.seq, e.drill_id, e.content_sha256, e.sealed_at.astimezone(timezone.utc).isoformat(), e.prev_hash,
        e.closed_by, e.supersedes, e.version or (1 if e.closed_by is None else 2),
    )  # fmt: skip


@pytest.mark.slow
def test_with_an_audit_key_a_recomputed_chain_is_a_forgery(
    demo_run: Path, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = tmp_path / "audit.key"
    key.write_bytes(b"k" * 32)
    monkeypatch.setenv("DRILL_AUDIT_KEY_FILE", str(key))
    drill(demo_run, db_url)
    drill(demo_run, db_url, storage=_flipped())
    code, doc = _verify(db_url)
    assert code == 0 and doc["authenticated"] == 2

    _rewrite_chain(db_url)
    code, doc = _verify(db_url)
    assert code == 1 and ("entry-forged", "entry 2 (drill #2)") in _codes(doc)
    monkeypatch.delenv("DRILL_AUDIT_KEY_FILE")
    assert (
        _verify(db_url, "--full")[0] == 0
    )  # without the key a rewrite is consistent: the key (or a pinned head) is what catches it


def test_an_unusable_audit_key_is_a_usage_error(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRILL_AUDIT_KEY_FILE", str(tmp_path / "absent.key"))
    res = invoke(CliRunner(), "audit", "verify", "--db", sqlite_url)
    assert res.exit_code == 2 and "the audit key file" in res.stderr and "cannot be read" in res.stderr


def test_an_empty_database_has_an_empty_chain(sqlite_url: str) -> None:
    res = invoke(CliRunner(), "audit", "verify", "--db", sqlite_url)
    assert res.exit_code == 0 and "audit chain: empty" in res.stdout


@pytest.mark.slow
def test_concurrent_drills_extend_one_chain(demo_run: Path, db_url: str) -> None:
    """Records closed at the same moment by different connections never fork the chain."""
    from drill.pipeline.outcome import DrillOutcome
    from drill.records.store import Records

    template = drill(demo_run, db_url)
    errors: list[BaseException] = []

    def close_many() -> None:
        db = open_database(db_url)
        try:
            for _ in range(8):
                doc = template.to_document()
                doc["id"] = None
                Records(db).insert_outcome(DrillOutcome.from_document(doc))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            db.close()

    threads = [threading.Thread(target=close_many) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    code, doc = _verify(db_url)
    assert code == 0 and doc["entries"] == 25 and doc["records"] == 25


@pytest.mark.slow
def test_reports_and_metrics_say_when_the_chain_is_broken(demo_run: Path, sqlite_url: str, tmp_path: Path) -> None:
    drill(demo_run, sqlite_url)
    _sql(sqlite_url, "UPDATE drills SET restore_seconds = 0.000001 WHERE id = 1")
    doc = json.loads(invoke(CliRunner(), "report", "--db", sqlite_url, "-f", "json").stdout)
    assert not doc["chain"]["intact"] and doc["chain"]["problems"][0]["code"] == "record-edited"
    html = invoke(CliRunner(), "report", "--db", sqlite_url, "-f", "html").stdout
    assert "Audit chain NOT INTACT" in html and "drill #1 fails its seal (entry 1)" in html
    prom = tmp_path / "drill.prom"
    invoke(CliRunner(), "metrics", "--db", sqlite_url, "--textfile", str(prom))
    assert "drill_audit_chain_intact 0.0" in prom.read_text()


# -- forgeries that must fail closed ----------------------------------------------------------
def _append_entry(
    url: str,
    drill_id: int,
    *,
    closed_by: str | None,
    supersedes: int | None = None,
    mac: str | None = None,
    key_id: str | None = None,
) -> None:
    """What a forger with write access and no key can do: append an entry sealing a record's
    current content, correctly linked to the chain's head."""
    from datetime import datetime, timezone

    from drill.records import audit
    from drill.records.legacy import Contents

    db = open_database(url)
    try:
        with db.sessions.begin() as s:
            last = s.scalars(sa.select(audit.AuditEntry).order_by(audit.AuditEntry.seq.desc()).limit(1)).one()
            version = None if closed_by is None else audit.VERSION  # None: the format of drill 0.4
            digest = (
                audit.record_digests(s, [drill_id])[drill_id] if version else Contents(s, [drill_id]).digest(drill_id)
            )
            e = audit.AuditEntry(
                seq=last.seq + 1, drill_id=drill_id, content_sha256=digest, prev_hash=last.hash, hash="",
                sealed_at=datetime.now(timezone.utc), closed_by=closed_by, supersedes=supersedes, mac=mac, key_id=key_id,
                version=version,
            )  # fmt: skip
            e.hash = hashlib.sha256(_message(e)).hexdigest()
            s.add(e)
    finally:
        db.close()


@pytest.mark.parametrize("closed_by", ["drill", "spool", "parent", None])
@pytest.mark.slow
def test_an_edit_followed_by_an_appended_reseal_is_named(three_drills: str, closed_by: str | None) -> None:
    """Every entry of every record is checked, not only its latest: a record sealed once and
    then sealed again (closed by a drill, a spool delivery, a parent, or in the old format to
    dodge the check) was rewritten — unless the first sealing was orphan recovery's guess."""
    _sql(three_drills, "UPDATE drills SET status = 'passed', exit_code = 0, message = NULL WHERE id = 2")
    _append_entry(three_drills, 2, closed_by=closed_by, supersedes=2 if closed_by else None)
    code, doc = _verify(three_drills)
    assert code == 1
    expected = "entry-downgraded" if closed_by is None else "record-resealed"
    assert expected in [c for c, _ in _codes(doc)], _codes(doc)


@pytest.mark.slow
def test_the_truth_superseding_an_orphan_recoverys_guess_is_intact(demo_run: Path, db_url: str) -> None:
    """The one legitimate second entry: a drill closed as aborted by orphan recovery, then its
    spooled verdict delivered."""
    from drill.pipeline import NullRecorder
    from drill.pipeline.recorder import DrillStart
    from drill.records.store import Records

    outcome = drill(demo_run, db_url, recorder=NullRecorder())  # its record "could not be written"
    db = open_database(db_url)
    try:
        records = Records(db)
        start = DrillStart(
            run_root=outcome.run_root,
            selector=outcome.selector,
            trigger="manual",
            device="cpu",
            policy=None,
            started_at=outcome.started_at,
            versions=outcome.versions,
        )
        outcome.id = records.begin_drill(start, pid=999999)  # a row left running by a process that is gone
        assert records.recover_orphans() == [outcome.id]
        assert records.deliver(outcome)
    finally:
        db.close()
    code, doc = _verify(db_url)
    assert code == 0, _codes(doc)
    assert doc["entries"] == 2 and doc["records"] == 1


@pytest.mark.slow
def test_under_an_audit_key_an_unauthenticated_or_foreign_entry_is_an_error(
    demo_run: Path, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = tmp_path / "audit.key"
    key.write_bytes(b"k" * 32)
    monkeypatch.setenv("DRILL_AUDIT_KEY_FILE", str(key))
    drill(demo_run, db_url)
    drill(demo_run, db_url)
    _sql(
        db_url,
        "UPDATE audit_log SET mac = NULL, key_id = NULL WHERE seq = 1",
        "UPDATE audit_log SET key_id = '0123456789abcdef' WHERE seq = 2",
    )
    code, doc = _verify(db_url)
    assert code == 1
    assert {("entry-unauthenticated", "entry 1 (drill #1)"), ("entry-other-key", "entry 2 (drill #2)")} <= set(
        _codes(doc)
    )
    assert all(p["severity"] == "error" for p in doc["problems"])
    # An operator who introduced the key at entry 3 says so; entries before it are counted, not failed.
    drill(demo_run, db_url)
    code, doc = _verify(db_url, "--keyed-from", "3")
    assert code == 0 and doc["unkeyed_before"] == 2 and doc["authenticated"] == 1


@pytest.mark.slow
def test_a_wiped_chain_under_records_claiming_an_old_version_is_not_before_the_chain(three_drills: str) -> None:
    _sql(three_drills, "DELETE FROM audit_log", "UPDATE drills SET drill_version = '0.1.0'")
    code, doc = _verify(three_drills)
    assert code == 1 and [c for c, _ in _codes(doc)].count("record-unsealed") == 3


@pytest.mark.slow
def test_a_dropped_chain_is_named_not_an_internal_error(three_drills: str) -> None:
    _sql(three_drills, "DROP TABLE audit_log")
    code, doc = _verify(three_drills)
    assert code == 1 and ("chain-missing", "audit_log") in _codes(doc)


@pytest.mark.slow
def test_a_deleted_schema_revision_is_a_database_error_never_an_empty_history(
    three_drills: str, demo_run: Path
) -> None:
    _sql(three_drills, "DELETE FROM alembic_version")
    for args in (
        ["history"],
        ["show", "1"],
        ["audit", "verify"],
        ["report", "-f", "json"],
        ["last-good", "--root", str(demo_run)],
        ["db", "status"],
        ["run", "--root", str(demo_run), "--no-replay"],
    ):
        res = invoke(CliRunner(), *args, "--db", three_drills)
        assert res.exit_code == 4, (args, res.exit_code, res.stdout, res.stderr)
        assert "no schema revision" in res.stderr, res.stderr


def test_a_configured_audit_key_that_cannot_be_read_records_nothing_unsealed(
    demo_run: Path, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fail closed: drill refuses to start (a usage error, nothing recorded) rather than seal a
    record without the key; a key that vanishes mid-drill sends the verdict to the spool."""
    from drill import history
    from drill.errors import UsageError

    monkeypatch.setenv("DRILL_AUDIT_KEY_FILE", str(tmp_path / "missing.key"))
    with pytest.raises(UsageError, match="audit key"):
        drill(demo_run, sqlite_url)
    res = invoke(CliRunner(), "run", "--root", str(demo_run), "--no-replay", "--db", sqlite_url)
    assert res.exit_code == 2 and "audit key" in res.stderr
    monkeypatch.delenv("DRILL_AUDIT_KEY_FILE")
    assert history(db=sqlite_url) == []


@pytest.mark.slow
def test_an_edit_after_an_intact_pass_is_named_by_every_pass_and_every_read(demo_run: Path, db_url: str) -> None:
    """A pass that found the log intact is no licence: a failed drill edited to "passed" after
    it is named by the next pass, and by every command that shows, selects or reports that
    record — the record fails its seal as it is read — and last-good never vouches for it."""
    from drill import last_good

    assert drill(demo_run, db_url, storage=_flipped()).status == "failed"  # step-30, damaged
    assert _verify(db_url)[0] == 0
    _sql(db_url, "UPDATE drills SET status = 'passed', exit_code = 0, message = NULL WHERE id = 1")
    code, doc = _verify(db_url)
    assert code == 1 and _codes(doc) == [("record-edited", "drill #1")]

    show = invoke(CliRunner(), "show", "1", "--db", db_url)
    assert show.exit_code == 1 and "fails its audit seal" in show.stdout + show.stderr, show.stdout
    shown = json.loads(invoke(CliRunner(), "show", "1", "--db", db_url, "--json").stdout)
    assert shown["seal"]["state"] == "broken" and shown["seal"]["code"] == "record-edited"
    listed = json.loads(invoke(CliRunner(), "history", "--db", db_url, "--json").stdout)
    assert listed[0]["seal"]["state"] == "broken"
    assert last_good(str(demo_run), db=db_url) is None
    res = invoke(CliRunner(), "last-good", "--root", str(demo_run), "--db", db_url)
    assert "step-30" not in res.stdout and "fails its audit seal" in res.stderr, (res.stdout, res.stderr)
    report = json.loads(invoke(CliRunner(), "report", "--db", db_url, "-f", "json").stdout)
    assert not report["chain"]["intact"] and ("record-edited", "drill #1") in _codes(report["chain"])


@pytest.mark.slow
def test_a_closed_row_inserted_outside_the_chain_is_an_error_whatever_it_claims(three_drills: str) -> None:
    """A row inserted with id 0 and an old drill_version passed every pass uncounted: a closed
    record outside the chain is an error whatever its id and version, and a read names it."""
    _sql(
        three_drills,
        "INSERT INTO drills (id, run_root, selector, trigger, host, pid, device, started_at, finished_at, status,"
        " exit_code, phase, drill_version) SELECT 0, run_root, selector, trigger, host, pid, device, started_at,"
        " finished_at, 'passed', 0, phase, '0.1.0' FROM drills WHERE id = 2",
    )
    code, doc = _verify(three_drills)
    assert code == 1 and _codes(doc) == [("record-unsealed", "drill #0")]
    listed = json.loads(invoke(CliRunner(), "history", "--db", three_drills, "--json").stdout)
    assert {d["id"]: d["seal"]["state"] for d in listed}[0] == "broken"


@pytest.mark.slow
def test_a_checks_large_evidence_is_stored_once_and_an_edit_of_it_is_named(demo_run: Path, db_url: str) -> None:
    """A model's tensor inventory is the same every night: stored once by its content, named
    from each record, verified by its name — edited or deleted, every record naming it fails."""
    for _ in range(3):
        assert drill(demo_run, db_url).status == "passed"
    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        (documents,) = conn.execute(sa.text("SELECT count(*) FROM documents")).one()
        (digest,) = conn.execute(sa.text("SELECT digest FROM documents LIMIT 1")).one()
    engine.dispose()
    assert documents == 1  # three drills, one inventory
    shown = json.loads(invoke(CliRunner(), "show", "1", "--json", "--db", db_url).stdout)
    assert shown.pop("seal")["state"] == "intact"
    assert next(c for c in shown["checks"] if c["name"] == "keys")["evidence"]["inventory_entries"] > 0
    _sql(db_url, f"UPDATE documents SET body = replace(body, 'float32', 'float16') WHERE digest = '{digest}'")
    code, doc = _verify(db_url)
    assert code == 1 and _codes(doc) == [("record-edited", f"evidence document {digest}")]
    res = invoke(CliRunner(), "show", "2", "--db", db_url)
    assert res.exit_code == 1 and "fails its audit seal" in res.stdout + res.stderr


@pytest.mark.slow
def test_the_pass_by_many_workers_names_what_the_pass_here_names(
    three_drills: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records recomputed by forked workers, while the log is walked here, are held to the same
    rule: an edit is named, whichever process recomputed it."""
    from drill.records import audit

    monkeypatch.setattr(audit, "PARALLEL_FROM", 1)
    code, doc = _verify(three_drills, "--workers", "2")
    assert code == 0 and doc["records"] == 3
    _sql(three_drills, "UPDATE drills SET status = 'passed', exit_code = 0, message = NULL WHERE id = 2")
    code, doc = _verify(three_drills, "--workers", "2")
    assert code == 1 and _codes(doc) == [("record-edited", "drill #2")]
