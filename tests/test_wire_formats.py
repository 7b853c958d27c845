"""The documents drill writes for other programs — the outcome document (``drill run --json``,
``drill show --json``, the spool), the alert body and a spooled save — carry a version and match
their published JSON schemas, checked against real outputs of real drills."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from typer.testing import CliRunner

from drill.alerts import payload
from drill.pipeline.outcome import DOCUMENT_VERSION, DocumentVersionError, DrillOutcome
from tests.conftest import drill, invoke


def _schema(name: str) -> dict[str, Any]:
    return json.loads(resources.files("drill.schemas").joinpath(name).read_text())


OUTCOME, ALERT = _schema("outcome-v1.schema.json"), _schema("alert-v1.schema.json")


def _valid(doc: dict[str, Any], schema: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator.check_schema(schema)
    errors = sorted(
        jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).iter_errors(doc), key=str
    )
    assert not errors, "; ".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors[:5])


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_run_and_show_json_of_a_passing_and_a_failing_drill_match_the_schema(
    demo_run: Path, sqlite_url: str, cli: CliRunner
) -> None:
    passed = invoke(
        cli, "run", "--root", str(demo_run), "--checkpoint", "latest", "--db", sqlite_url, "--json", "--no-replay"
    )
    assert passed.exit_code == 0, passed.stdout
    shard = next((demo_run / "step-30").glob("*.distcp"))
    _flip(shard, shard.stat().st_size // 2)
    failed = invoke(
        cli, "run", "--root", str(demo_run), "--checkpoint", "latest", "--db", sqlite_url, "--json", "--no-replay"
    )
    assert failed.exit_code == 1, failed.stdout
    docs = [json.loads(passed.stdout), json.loads(failed.stdout)]
    assert any(f["severity"] == "error" for c in docs[1]["checks"] for f in c["findings"])
    for doc in docs:
        assert doc["version"] == DOCUMENT_VERSION
        _valid(doc, OUTCOME)
        shown = invoke(cli, "show", str(doc["id"]), "--db", sqlite_url, "--json")
        assert shown.exit_code == 0
        _valid(json.loads(shown.stdout), OUTCOME)
        _valid(payload(doc, "nightly"), ALERT)  # what a webhook and an alert command receive


def test_a_spooled_resume_and_save_carry_their_versions(
    demo_run: Path, sqlite_url: str, private_spool: Path, tmp_path: Path
) -> None:
    import torch

    import drill.sdk
    from drill.records.spool import SAVE_VERSION

    ckpt = tmp_path / "step-1"
    drill.sdk.save({"model": {"w": torch.arange(8.0)}}, checkpoint_id=str(ckpt), db=sqlite_url)
    state = {"model": {"w": torch.zeros(8)}}
    drill.sdk.load(state, checkpoint_id=str(ckpt), db=sqlite_url)
    docs = [json.loads(p.read_text()) for p in sorted(private_spool.glob("*.json"))]
    saves = [d for d in docs if d.get("kind") == "save"]
    resumes = [d for d in docs if d.get("kind") is None]
    assert len(saves) == 1 and saves[0]["version"] == SAVE_VERSION
    assert len(resumes) == 1
    _valid(resumes[0], OUTCOME)
    assert drill.sdk.flush_records(sqlite_url) == 2


def test_a_document_from_a_newer_drill_is_refused_and_kept(
    demo_run: Path, sqlite_url: str, private_spool: Path
) -> None:
    from drill.records.db import open_database
    from drill.records.recorder import DatabaseRecorder
    from drill.records.spool import Spool
    from drill.records.urls import database_key

    doc = drill(demo_run, sqlite_url).to_document()
    older = {k: v for k, v in doc.items() if k != "version"}  # written by drill 0.5: same shape
    assert DrillOutcome.from_document(older).status.value == "passed"
    newer = {**doc, "id": None, "pid": 999_999_997, "version": DOCUMENT_VERSION + 1}
    with pytest.raises(DocumentVersionError, match="upgrade drill"):
        DrillOutcome.from_document(newer)
    spool = Spool(database_key(sqlite_url))
    kept = spool.put(newer)
    save = spool.put({"kind": "save", "version": 99, "checkpoint": "/x"})
    database = open_database(sqlite_url)
    try:
        result = DatabaseRecorder(database).flush()
    finally:
        database.close()
    assert result.delivered == 0
    assert set(result.rejected) == {str(kept), str(save)}
    assert all("written by a newer drill" in why for why in result.rejected.values())
    assert kept.exists() and save.exists()  # left for a newer drill to deliver
