"""What a new user hit, each as a class: the database, the record, the output, the policies."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from tests.conftest import invoke

ROOT = Path(__file__).resolve().parent.parent


# -- the database ---------------------------------------------------------------------------
@pytest.mark.parametrize("url", ["mysql://db/drill", "postgresql:/localhost/drill", "sqlite:relative.db", "redis://x"])
def test_a_database_url_drill_does_not_know_is_refused_and_creates_nothing(
    tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    res = invoke(CliRunner(), "history", "--db", url)
    assert res.exit_code == 2 and "expected sqlite:///PATH" in res.stderr
    assert list(tmp_path.iterdir()) == [tmp_path / "spool"] or list(tmp_path.iterdir()) == []


def test_an_sqlite_file_in_a_directory_that_does_not_exist_is_refused(tmp_path: Path, demo_run: Path) -> None:
    res = invoke(
        CliRunner(), "run", "--root", str(demo_run), "--no-replay", "--db", str(tmp_path / "no" / "such" / "drill.db")
    )
    assert res.exit_code == 2 and "does not exist (create it first)" in res.stderr
    assert not (tmp_path / "no").exists()


READERS = [
    ["history"],
    ["show", "1"],
    ["runs"],
    ["last-good", "--root", "."],
    ["report"],
    ["metrics", "--textfile", "drill.prom"],
    ["goodput", "--root", "."],
    ["audit", "verify"],
    ["scheduler", "status"],
    ["db", "status"],
]


@pytest.mark.parametrize("command", READERS, ids=lambda c: " ".join(c))
def test_a_command_that_only_reads_refuses_an_sqlite_file_in_a_directory_that_does_not_exist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    """A mistyped ``--db`` names no records: a read must not answer "nothing recorded" (an empty
    report, no last good, exit 0) from a database that cannot exist — it is refused as a write is."""
    monkeypatch.chdir(tmp_path)
    res = invoke(CliRunner(), *command, "--db", str(tmp_path / "no" / "such" / "drill.db"))
    assert res.exit_code == 2 and "does not exist (create it first)" in res.stderr, res.stderr
    assert res.stdout == "" and not (tmp_path / "no").exists()
    assert list(tmp_path.iterdir()) in ([], [tmp_path / "spool"])


def test_a_command_that_only_reads_finds_nothing_recorded_in_a_new_file_of_an_existing_directory(
    tmp_path: Path,
) -> None:
    """The other side of the line: a database not written yet, where one can be, is empty."""
    res = invoke(CliRunner(), "history", "--db", str(tmp_path / "drill.db"))
    assert res.exit_code == 0 and "no drills recorded" in res.stderr + res.stdout
    assert not (tmp_path / "drill.db").exists()


# -- locations no storage can address ----------------------------------------------------------
LOCATED = {  # every command that takes a run root or a checkpoint: where the location goes
    "run": ["run", "--root", "{}", "--no-replay"],
    "verify": ["verify", "{}"],
    "seal": ["seal", "{}"],
    "burst": ["burst", "--root", "{}"],
    "last-good": ["last-good", "--root", "{}"],
    "goodput": ["goodput", "--root", "{}"],
    "history": ["history", "--root", "{}"],
    "report": ["report", "--root", "{}"],
    "runs": ["runs", "{}"],
}
STORAGE = ("run", "verify", "seal", "burst", "last-good")
"""The commands that reach storage itself (the others ask the records, keyed by the location)."""


@pytest.fixture
def no_s3(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """S3 settings that can send nothing anywhere: an endpoint on a closed local port."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "drill-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "drill-test-secret")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _at(command: str, location: str, db: Path) -> list[str]:
    args = [a.format(location) for a in LOCATED[command]]
    return args if command == "seal" else [*args, "--db", str(db)]


@pytest.mark.parametrize("command", LOCATED)
@pytest.mark.parametrize(
    ("location", "says"),
    [
        ("s3://", "names no bucket"),
        ("s3:///run7", "names no bucket"),
        ("gs://bucket/run7", "unsupported storage scheme 'gs'"),
    ],
)
def test_a_location_no_storage_can_address_is_a_usage_error_for_every_command(
    no_s3: Path, command: str, location: str, says: str
) -> None:
    """Not an internal error (exit 70), not "storage unavailable" (exit 5): what was typed is
    wrong, and it is refused in one line before any request."""
    res = invoke(CliRunner(), *_at(command, location, no_s3 / "drill.db"))
    assert res.exit_code == 2 and says in res.stderr, res.stderr
    assert "internal error" not in res.stderr and "Traceback" not in res.stderr and res.stdout == ""


@pytest.mark.parametrize("command", STORAGE)
def test_a_bucket_name_s3_refuses_is_a_usage_error_not_an_unavailable_storage(no_s3: Path, command: str) -> None:
    res = invoke(CliRunner(), *_at(command, "s3://ckpt:7480/run7", no_s3 / "drill.db"))
    assert res.exit_code == 2 and "not a bucket name S3 accepts" in res.stderr, res.stderr
    assert "gave up after" not in res.stderr  # refused at once, never retried


def test_an_s3_endpoint_that_is_not_a_url_is_a_usage_error(no_s3: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "minio-local")
    res = invoke(CliRunner(), "verify", "s3://ckpt/run7/step-1", "--db", str(no_s3 / "drill.db"))
    assert res.exit_code == 2 and "S3 settings: Invalid endpoint: minio-local" in res.stderr, res.stderr


def test_an_s3_profile_that_is_not_configured_is_a_credentials_error(
    no_s3: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_PROFILE", "drill-no-such-profile")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(no_s3 / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(no_s3 / "credentials"))
    res = invoke(CliRunner(), "verify", "s3://ckpt/run7/step-1", "--db", str(no_s3 / "drill.db"))
    assert res.exit_code == 5 and "could not be found" in res.stderr and "credentials" in res.stderr, res.stderr
    assert "internal error" not in res.stderr


@pytest.mark.parametrize("command", ["verify", "run"])
@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("DRILL_S3_CONCURRENCY", "abc", "$DRILL_S3_CONCURRENCY='abc' is not a whole number"),
        ("DRILL_S3_CONCURRENCY", "0", "must be at least 1"),
        ("DRILL_S3_PART_SIZE", "lots", "$DRILL_S3_PART_SIZE='lots' is not a size"),
        ("DRILL_S3_ADDRESSING_STYLE", "sideways", "expected auto, path or virtual"),
        ("AWS_CONFIG_FILE", "not ini [[[", "Unable to parse config file"),
    ],
)
def test_object_store_settings_that_cannot_be_used_are_a_usage_error(
    no_s3: Path, monkeypatch: pytest.MonkeyPatch, command: str, variable: str, value: str, says: str
) -> None:
    """Settings from the environment are what was configured: one line naming the setting,
    exit 2 — not an internal error, not an unavailable storage."""
    if variable == "AWS_CONFIG_FILE":
        (no_s3 / "config").write_text(value)
        value = str(no_s3 / "config")
    monkeypatch.setenv(variable, value)
    location = "s3://ckpt/run7/step-1" if command == "verify" else "s3://ckpt/run7"
    res = invoke(CliRunner(), *_at(command, location, no_s3 / "drill.db"))
    assert res.exit_code == 2 and "S3 settings: " in res.stderr and says in res.stderr, res.stderr


@pytest.mark.parametrize("url", ["postgresql://[::1", "postgresql://127.0.0.1:abc/drill"])
@pytest.mark.parametrize("command", [["history"], ["report"], ["run", "--root", "{}", "--no-replay"]])
def test_a_database_url_that_does_not_parse_is_a_usage_error(
    tmp_path: Path, demo_run: Path, url: str, command: list[str]
) -> None:
    args = [a.format(demo_run) for a in command]
    res = invoke(CliRunner(), *args, "--db", url)
    assert res.exit_code == 2 and "is not a database URL" in res.stderr, res.stderr


def test_a_default_database_whose_directory_cannot_be_created_is_a_database_error(
    tmp_path: Path, demo_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``$XDG_DATA_HOME`` under a regular file (or on a filesystem nothing can be created on):
    one line naming the directory and how to choose another, before the drill begins — not
    exit 70."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "a-file" / "share"))
    monkeypatch.delenv("DRILL_DATABASE_URL", raising=False)
    res = invoke(CliRunner(), "run", "--root", str(demo_run), "--no-replay")
    assert res.exit_code == 4 and "cannot create the default database's directory" in res.stderr, res.stderr
    assert "$DRILL_DATABASE_URL" in res.stderr and "internal error" not in res.stderr


def test_a_demo_directory_that_cannot_be_created_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    res = invoke(CliRunner(), "demo", str(tmp_path / "a-file" / "run"), "--steps", "2", "--save-every", "1")
    assert res.exit_code == 2 and "cannot create" in res.stderr and "Not a directory" in res.stderr, res.stderr


def test_db_status_exits_4_when_behind_even_with_json(postgres_url: str) -> None:
    res = invoke(CliRunner(), "db", "status", "--json", "--db", postgres_url)
    assert res.exit_code == 4 and json.loads(res.stdout)["state"] == "behind"


@pytest.mark.slow
def test_a_schema_newer_than_drill_says_so_and_upgrade_refuses(sqlite_url: str) -> None:
    from drill.records.db import open_database

    open_database(sqlite_url).close()
    engine = create_engine(sqlite_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    status = invoke(CliRunner(), "db", "status", "--db", sqlite_url)
    assert status.exit_code == 4 and "ahead: this drill is older than the database" in status.stdout
    upgrade = invoke(CliRunner(), "db", "upgrade", "--db", sqlite_url)
    assert upgrade.exit_code == 4 and "this drill is older than the database" in upgrade.stderr
    assert "internal error" not in upgrade.stderr


def test_read_only_commands_never_write_the_database(demo_run: Path, tmp_path: Path) -> None:
    db = tmp_path / "drill.db"
    assert invoke(CliRunner(), "run", "--root", str(demo_run), "--no-replay", "-q", "--db", str(db)).exit_code == 0
    before = db.read_bytes()
    assert invoke(CliRunner(), "history", "--db", str(db)).exit_code == 0
    assert invoke(CliRunner(), "show", "1", "--json", "--db", str(db)).exit_code == 0
    assert invoke(CliRunner(), "scheduler", "status", "--db", str(db)).exit_code == 3
    assert db.read_bytes() == before


def test_read_only_commands_work_on_a_read_only_database(demo_run: Path, tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root ignores file permissions (the bytes-unchanged test above runs everywhere)")
    db = tmp_path / "ro" / "drill.db"
    db.parent.mkdir()
    assert invoke(CliRunner(), "run", "--root", str(demo_run), "--no-replay", "-q", "--db", str(db)).exit_code == 0
    for p in db.parent.iterdir():
        p.chmod(stat.S_IRUSR)
    db.parent.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        assert invoke(CliRunner(), "history", "--db", str(db)).exit_code == 0
        assert invoke(CliRunner(), "show", "1", "--db", str(db)).exit_code == 0
    finally:
        db.parent.chmod(stat.S_IRWXU)


def test_history_of_a_database_that_does_not_exist_yet_creates_none(tmp_path: Path) -> None:
    res = invoke(CliRunner(), "history", "--db", str(tmp_path / "drill.db"))
    assert res.exit_code == 0 and "no drills recorded" in res.stderr and not (tmp_path / "drill.db").exists()


# -- what a drill prints --------------------------------------------------------------------
@pytest.mark.slow
def test_show_prints_the_evidence_the_replayed_steps_and_the_alerts(demo_run: Path, sqlite_url: str) -> None:
    res = invoke(CliRunner(), "run", "--root", str(demo_run), "--replay-steps", "2", "--json", "-q", "--db", sqlite_url)
    drill_id = json.loads(res.stdout)["id"]
    from drill.alerts import Delivery
    from drill.records.db import open_database
    from drill.records.store import Records

    db = open_database(sqlite_url)
    Records(db).record_alerts(drill_id, [Delivery("webhook", "https://hooks.example/…", True, 1)])
    db.close()
    shown = invoke(CliRunner(), "show", str(drill_id), "--db", sqlite_url).stdout
    assert "bytes_verified:" in shown and "step_counters:" in shown  # each check's evidence
    assert "replayed steps" in shown and "31" in shown and "32" in shown
    assert "alert webhook → https://hooks.example/…: delivered after 1 attempt(s)" in shown
    assert "restore" in shown and "other" in shown  # the phases, adding up to the restore


@pytest.mark.slow
def test_fewer_replay_steps_than_asked_says_why(demo_run: Path, sqlite_url: str) -> None:
    res = invoke(
        CliRunner(), "run", "--root", str(demo_run), "--replay-steps", "20", "--json", "-q", "--db", sqlite_url
    )
    doc = json.loads(res.stdout)
    assert res.exit_code == 0
    assert (
        "6 of the 20 steps asked for: the original run's record (drill-steps.jsonl) has no more after step 30"
        in doc["replay"]["reason"]
    )


def test_a_sampled_drill_verifies_about_what_it_was_asked(demo_run: Path, sqlite_url: str) -> None:
    res = invoke(
        CliRunner(),
        "run",
        "--root",
        str(demo_run),
        "--sample",
        "50%",
        "--no-replay",
        "--json",
        "-q",
        "--db",
        sqlite_url,
    )
    integrity = next(c for c in json.loads(res.stdout)["checks"] if c["name"] == "integrity")
    share = integrity["evidence"]["bytes_verified"] / integrity["evidence"]["bytes_listed"]
    assert 0.3 < share < 0.7, share
    assert integrity["evidence"]["coverage"]["percent"] < 100


def test_long_drills_log_a_line_per_phase_when_stderr_is_not_a_terminal(demo_run: Path, sqlite_url: str) -> None:
    res = invoke(CliRunner(), "run", "--root", str(demo_run), "--no-replay", "--db", sqlite_url)
    phases = [line.split()[3].rstrip(":") for line in res.stderr.splitlines() if line.startswith("drill: +")]
    assert phases == ["discover", "plan", "restore", "read", "checks"]  # --no-replay: no replay announced
    quiet = invoke(CliRunner(), "run", "--root", str(demo_run), "--no-replay", "-q", "--db", sqlite_url)
    assert quiet.stderr == ""


def test_require_sealed_on_the_command_line_names_the_flag_not_a_policy(demo_run: Path, sqlite_url: str) -> None:
    os.remove(demo_run / "step-30" / "drill-manifest.json")
    res = invoke(
        CliRunner(), "run", "--root", str(demo_run), "--require-sealed", "--no-replay", "-q", "--db", sqlite_url
    )
    assert res.exit_code == 1 and "(--require-sealed)" in res.stdout and "policy" not in res.stdout + res.stderr


# -- policies -------------------------------------------------------------------------------
def test_policy_check_warns_about_what_cannot_run_here(
    tmp_path: Path, demo_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NO_SUCH_HOOK", raising=False)
    path = tmp_path / "p.yaml"
    device = "cuda:0" if not torch.cuda.is_available() else "cpu"
    path.write_text(
        f"name: p\ncheckpoints: {{root: {demo_run}}}\ndevice: {device}\nalerts: {{webhook: 'env:NO_SUCH_HOOK'}}\n"
    )
    res = invoke(CliRunner(), "policy", "check", str(path))
    assert res.exit_code == 0 and res.stdout.startswith("ok: ")
    assert "$NO_SUCH_HOOK is not set" in res.stderr
    if device.startswith("cuda"):
        assert "no usable CUDA device" in res.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without CUDA")
@pytest.mark.slow
def test_a_policy_that_cannot_run_here_is_one_line_naming_its_field(
    tmp_path: Path, demo_run: Path, sqlite_url: str
) -> None:
    path = tmp_path / "gpu.yaml"
    path.write_text(f"name: gpu\ncheckpoints: {{root: {demo_run}}}\ndevice: cuda\nreplay: {{enabled: false}}\n")
    res = subprocess.run(
        [str(Path(sys.executable).parent / "drill"), "run", "--policy", str(path), "--db", sqlite_url],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert res.returncode == 2
    (line,) = res.stderr.strip().splitlines()
    assert "CUDA is not available" in line and "--device" not in line


def test_the_cron_example_names_drill_by_its_full_path() -> None:
    readme = (ROOT / "docs" / "nightly.md").read_text()
    cron = readme[readme.index("```cron") : readme.index("```", readme.index("```cron") + 7)]
    line = next(ln for ln in cron.splitlines() if "drill run" in ln)
    assert "/bin/drill run" in line, "cron's PATH does not find a bare `drill`"


# -- code in the run directory --------------------------------------------------------------
@pytest.mark.slow
def test_an_entrypoint_the_user_names_may_live_in_the_run_directory(demo_run: Path, sqlite_url: str) -> None:
    (demo_run / "my_replay.py").write_text("from drill.demo.replay import build_replay as build\n")
    res = invoke(
        CliRunner(),
        "run",
        "--root",
        str(demo_run),
        "--replay",
        "my_replay:build",
        "--replay-steps",
        "1",
        "-q",
        "--db",
        sqlite_url,
    )
    assert res.exit_code == 0, res.stdout + res.stderr


def test_children_never_import_from_the_run_directory(tmp_path: Path) -> None:
    from drill.proc import trusted_path

    run = tmp_path / "run"
    run.mkdir()
    sys.path.insert(0, str(run))
    try:
        assert str(run) not in trusted_path([str(run)])
    finally:
        sys.path.remove(str(run))
