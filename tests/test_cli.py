"""The CLI end to end through typer's CliRunner: exact exit codes, stdout data, stderr talk."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from drill import history
from drill.records.db import head_revision
from tests.conftest import drill, invoke
from tests.support.faults import FaultyStorage


def _drills(db_url: str) -> list[dict]:
    return [d.to_document(with_checks=False) for d in history(db=db_url, limit=1000)]


@pytest.mark.slow
def test_run_latest_passes_and_is_recorded(cli: CliRunner, demo_run: Path, db_url: str) -> None:
    res = invoke(cli, "run", "--root", str(demo_run), "--checkpoint", "latest", "--db", db_url)
    assert res.exit_code == 0, res.stderr
    assert "PASSED" in res.stdout and "step-30" in res.stdout
    assert "drill: failed" not in res.stderr and "error" not in res.stderr  # only the per-phase log lines
    (done,) = _drills(db_url)
    assert done["status"] == "passed" and done["exit_code"] == 0
    assert done["checkpoint"]["step"] == 30
    assert done["timings"]["restore"] > 0 and done["bytes_read"] > 0
    assert all(
        done["timings"][p] is not None for p in ("discover", "plan", "read", "load", "other", "checks", "replay")
    )
    t = done["timings"]
    assert t["restore"] == pytest.approx(t["discover"] + t["plan"] + t["read"] + t["load"] + t["other"])


@pytest.mark.slow
def test_run_json_is_one_document_on_stdout(cli: CliRunner, demo_run: Path, sqlite_url: str) -> None:
    res = invoke(cli, "run", "--root", str(demo_run), "-c", "step:20", "--json", "--db", sqlite_url)
    assert res.exit_code == 0
    doc = json.loads(res.stdout)
    assert doc["status"] == "passed" and doc["checkpoint"]["step"] == 20
    assert [c["name"] for c in doc["checks"]] == [
        "discover",
        "resume",
        "integrity",
        "durable",
        "files",
        "load",
        "keys",
        "contract",
        "replay",
    ]
    assert doc["bytes_read"] == sum(
        p.stat().st_size for p in (demo_run / "step-20").iterdir() if p.name != "drill-manifest.json"
    )
    shown = json.loads(invoke(cli, "show", str(doc["id"]), "--json", "--db", sqlite_url).stdout)
    assert shown.pop("seal") == {"state": "intact", "code": None, "message": None, "entry": 1}  # as read back
    assert shown == doc  # one document: what ran is what was recorded


def test_run_by_path_needs_no_root(cli: CliRunner, demo_run: Path, sqlite_url: str) -> None:
    res = invoke(cli, "run", "-c", str(demo_run / "step-10"), "--no-replay", "--json", "--db", sqlite_url)
    assert res.exit_code == 0
    assert json.loads(res.stdout)["checkpoint"]["step"] == 10


@pytest.mark.slow
def test_deleted_shard_fails_the_drill_naming_the_file(cli: CliRunner, demo_run: Path, db_url: str) -> None:
    os.remove(demo_run / "step-30" / "__0_1.distcp")
    res = invoke(cli, "run", "--root", str(demo_run), "--json", "--db", db_url)
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    assert doc["status"] == "failed"
    for name in ("files", "integrity"):  # the metadata needs it, and the manifest listed it
        check = next(c for c in doc["checks"] if c["name"] == name)
        assert check["status"] == "failed"
        assert [(f["code"], f["subject"]) for f in check["findings"]] == [("file-missing", "__0_1.distcp")]
    assert (
        "__0_1.distcp" in res.stderr
        and len([ln for ln in res.stderr.splitlines() if ln.startswith("drill: failed")]) == 1
    )
    shown = invoke(cli, "show", str(doc["id"]), "--db", db_url)
    assert "file-missing [__0_1.distcp]" in shown.stdout


def test_a_file_the_storage_refuses_is_an_error_not_a_failure(demo_run: Path, sqlite_url: str) -> None:
    """Permission denied is the infrastructure's fault, not the checkpoint's: error (exit 5),
    the file named, no verdict on the checkpoint's state."""
    outcome = drill(demo_run, sqlite_url, storage=FaultyStorage({"__0_0.distcp": "deny"}))
    assert (outcome.status.value, int(outcome.exit_code)) == ("error", 5)
    assert [(f.code, f.subject) for f in outcome.findings if f.check == "files"] == [("storage-denied", "__0_0.distcp")]
    assert outcome.check("contract").status.value == "skipped"


def test_missing_part_fails_the_keys_check(tmp_path: Path, sqlite_url: str, cli: CliRunner) -> None:
    import torch.distributed.checkpoint as dcp

    with pytest.warns(UserWarning):
        dcp.save({"model": {"w": torch.ones(3)}, "train_state": {"step": 1}}, checkpoint_id=str(tmp_path / "step-1"))
    res = invoke(cli, "run", "--root", str(tmp_path), "--json", "--db", sqlite_url)
    assert res.exit_code == 1
    keys = next(c for c in json.loads(res.stdout)["checks"] if c["name"] == "keys")
    assert {f["subject"] for f in keys["findings"] if f["code"] == "part-missing"} == {
        "optimizer",
        "lr_scheduler",
        "dataloader",
        "rng",
    }


@pytest.mark.parametrize(
    ("setup", "args", "code", "stderr_has"),
    [
        ("none", ["--root", "{tmp}/absent"], 3, "does not exist"),
        ("empty", ["--root", "{tmp}/empty"], 3, "no checkpoint under"),
        ("incomplete", ["--root", "{tmp}/inc"], 3, "only incomplete saves (step-5)"),
        ("demo", ["--root", "{run}", "-c", "step:7"], 3, "(retained: 10, 20, 30)"),
        ("demo", ["--root", "{run}", "-c", "newest"], 2, "--checkpoint: unknown checkpoint form 'newest'"),
        ("demo", ["--root", "{run}", "--device", "tpu"], 2, "--device: unknown device 'tpu'"),
        ("demo", ["--root", "{run}", "--sample", "1/0"], 2, "--sample: bad subset '1/0'"),
        ("demo", ["--root", "{run}", "--sample", "\u00b2/3"], 2, "--sample: bad subset '\u00b2/3'"),
        ("demo", ["--root", "{run}", "-c", "step:\u2460"], 2, "step must be a non-negative integer, as in step:1200"),
        ("demo", ["--root", "{run}", "--format", "zip"], 2, "--format: unknown format 'zip'"),
        ("demo", ["--root", "{run}", "--replay-steps", "0"], 2, "replay steps must be an integer of at least 1"),
        ("demo", ["-c", "latest"], 2, "--root is required"),
        ("demo", ["--root", ""], 2, "blank: nothing given (as a path, it would mean the working directory)"),
        ("demo", ["--root", "{run}", "--bogus"], 2, "No such option: --bogus"),
    ],
)
@pytest.mark.slow
def test_bad_input_is_one_line_with_its_exit_code_and_keeps_records(
    cli: CliRunner, demo_run: Path, tmp_path: Path, db_url: str, setup: str, args: list[str], code: int, stderr_has: str
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "inc" / "step-5").mkdir(parents=True)
    (tmp_path / "inc" / "step-5" / "__0_0.distcp").write_bytes(b"partial")
    assert invoke(cli, "run", "--root", str(demo_run), "--no-replay", "--db", db_url).exit_code == 0
    before = _drills(db_url)

    argv = [a.format(tmp=tmp_path, run=demo_run) for a in args]
    res = invoke(cli, "run", *argv, "--quiet", "--db", db_url)
    assert res.exit_code == code
    lines = res.stderr.strip().splitlines()
    assert stderr_has in lines[0] and (len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("hint: "))), (
        res.stderr
    )
    assert "Traceback" not in res.stdout + res.stderr

    after = _drills(db_url)
    assert after[-len(before) :] == before  # every earlier record intact
    if setup == "incomplete":  # a run whose saves are all unfinished: that is the verdict, on the record
        assert len(after) == len(before) + 1 and after[0]["status"] == "failed"
    else:  # a typo — no such root, no such step, a bad flag — never becomes an audit record
        assert len(after) == len(before)


def test_a_checkpoint_named_relative_to_the_root_is_found_from_any_working_directory(
    cli: CliRunner, demo_run: Path, tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--root RUN --checkpoint step-20`` names RUN/step-20 wherever drill is started (it was
    looked up in the working directory and not found); a path that exists from the working
    directory, and not under the root, is still that path."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for name in ("step-20", "./step-20", str(demo_run / "step-20"), f"{demo_run.name}/step-20"):
        if "/" in name and not name.startswith((".", "/")):
            monkeypatch.chdir(demo_run.parent)  # a path from the working directory
        res = invoke(cli, "run", "--root", str(demo_run), "-c", name, "--no-replay", "--json", "--db", sqlite_url)
        assert res.exit_code == 0, (name, res.stderr)
        assert json.loads(res.stdout)["checkpoint"]["name"] == "step-20", name
    res = invoke(cli, "run", "--root", str(demo_run), "-c", "step-25", "--no-replay", "--db", sqlite_url)
    assert (
        res.exit_code == 3
        and "step-25 is not a checkpoint under" in res.stderr
        and "(retained: 10, 20, 30)" in res.stderr
    )


def _valued_parameters(kind: str = "any") -> list[tuple[list[str], str, list[str]]]:
    """Every option and argument of every command that takes a value (``kind="int"``: an
    integer): (command path, its name, the argv that gives it a blank one, or 2**63)."""
    import typer
    from typer.main import get_command

    from drill.cli.app import app

    found: list[tuple[list[str], str, list[str]]] = []

    def walk(command, path: list[str], parent=None) -> None:
        ctx = typer.Context(command, parent=parent) if parent is None else type(parent)(command, parent=parent)
        if hasattr(command, "list_commands"):
            for name in command.list_commands(ctx):
                walk(command.get_command(ctx, name), [*path, name], ctx)
            return
        for param in command.params:
            if getattr(param, "is_flag", False) or param.name == "help":
                continue
            if kind != "any" and getattr(param.type, "name", "") not in NUMERIC[kind]:
                continue
            value = {"int": str(1 << 63), "float": "nan", "any": ""}[kind]
            given = [param.opts[0], value] if param.param_type_name == "option" else [value]
            found.append((path, param.name, given))

    walk(get_command(app), [])
    return found


NUMERIC = {"int": ("integer", "int"), "float": ("float",)}
VALUED = _valued_parameters()
INTEGERS = _valued_parameters("int")
FLOATS = _valued_parameters("float")


@pytest.mark.parametrize(("path", "name", "given"), VALUED, ids=[f"{' '.join(p)}:{n}" for p, n, _ in VALUED])
def test_a_blank_value_is_a_usage_error_for_every_option_and_argument(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: list[str], name: str, given: list[str]
) -> None:
    """``--root ""`` or ``drill runs "$RUN"`` with the variable unset: exit 2 and one line for
    every command's every valued parameter — never the working directory (``burst --root ""``
    was an internal error, ``demo ""`` wrote into it, ``runs ""`` and ``history --root ""``
    answered for a run named nothing, ``verify --db ""`` used the default database)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DRILL_DATABASE_URL", f"sqlite:///{tmp_path}/d.db")
    res = invoke(cli, *path, *given)
    assert res.exit_code == 2, (res.exit_code, res.stdout, res.stderr)
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith(f"drill: error: Invalid value for '{given[0] if len(given) == 2 else name}'"), line
    assert line.endswith(": blank: nothing given (as a path, it would mean the working directory)"), line
    assert list(tmp_path.iterdir()) == []  # nothing written, no database created


@pytest.mark.parametrize(("path", "name", "given"), INTEGERS, ids=[f"{' '.join(p)}:{n}" for p, n, _ in INTEGERS])
def test_an_integer_no_record_can_hold_is_a_usage_error_for_every_integer_parameter(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: list[str], name: str, given: list[str]
) -> None:
    """``drill show 10**21``, ``history --limit 10**21``: exit 2 and one line, where they were
    internal errors (exit 70: "Python int too large to convert to SQLite INTEGER")."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DRILL_DATABASE_URL", f"sqlite:///{tmp_path}/d.db")
    res = invoke(cli, *path, *given)
    assert res.exit_code == 2, (res.exit_code, res.stdout, res.stderr)
    (line,) = res.stderr.strip().splitlines()
    assert line.endswith("out of range: a record holds integers from -9223372036854775808 to 9223372036854775807"), line


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400"])
@pytest.mark.parametrize(("path", "name", "given"), FLOATS, ids=[f"{' '.join(p)}:{n}" for p, n, _ in FLOATS])
def test_a_number_that_is_not_finite_is_a_usage_error_for_every_float_parameter(
    cli: CliRunner,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    path: list[str],
    name: str,
    given: list[str],
    value: str,
) -> None:
    """``drill verify --timeout nan`` (or inf, or 1e400) was an internal error (exit 70, from the
    interval timer); ``--coverage-days inf`` was taken. Every float parameter: exit 2, one line."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DRILL_DATABASE_URL", f"sqlite:///{tmp_path}/d.db")
    res = invoke(cli, *path, f"{given[0]}={value}" if len(given) == 2 else value)  # = : "-inf" is no option
    assert res.exit_code == 2, (res.exit_code, res.stdout, res.stderr)
    (line,) = res.stderr.strip().splitlines()
    assert line.endswith("not a finite number (nan, inf and values past 1.8e308 mean nothing here)"), line


@pytest.mark.parametrize("command", [["verify", "{ckpt}"], ["last-good", "--root", "{run}"], ["report", "-f", "json"]])
@pytest.mark.parametrize("seconds", ["-1", "0"])
def test_every_timeout_is_a_positive_number_of_seconds(
    cli: CliRunner, demo_run: Path, sqlite_url: str, command: list[str], seconds: str
) -> None:
    """``drill verify --timeout -1`` was an internal error (the interval timer refused it) and
    ``--timeout 0`` no timeout at all: each command's ``--timeout`` is checked in one place."""
    argv = [a.format(ckpt=demo_run / "step-30", run=demo_run) for a in command]
    res = invoke(cli, *argv, f"--timeout={seconds}", "--db", sqlite_url)
    assert res.exit_code == 2, (res.exit_code, res.stderr)
    assert res.stderr.strip() == f"drill: error: --timeout must be a positive number of seconds, not {seconds}"


def test_a_timeout_longer_than_any_timer_is_as_good_as_none(cli: CliRunner, demo_run: Path, sqlite_url: str) -> None:
    """``--timeout 1e300`` is finite and positive, but past what the interval timer, a poll or
    a rendezvous can be set to (``OverflowError``, exit 70, in ``verify``, ``run`` and the
    replay): every wait is bounded (``drill.units.bounded_wait``), the drill runs to its end."""
    res = invoke(cli, "verify", str(demo_run / "step-30"), "--timeout", "1e300", "--db", sqlite_url)
    assert res.exit_code == 0, res.stderr
    res = invoke(
        cli, "run", "--root", str(demo_run), "-c", "step-20", "--replay-steps", "2",
        "--timeout", "1e300", "--replay-timeout", "1e300", "--json", "--quiet", "--db", sqlite_url,
    )  # fmt: skip
    assert res.exit_code == 0, res.stderr
    assert next(c for c in json.loads(res.stdout)["checks"] if c["name"] == "replay")["status"] == "passed"


def test_blank_values_from_defaults_or_the_environment_are_not_refused(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only what was typed is held to it: an empty ``DRILL_DATABASE_URL`` is the default."""
    monkeypatch.setenv("DRILL_DATABASE_URL", "")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    res = invoke(cli, "db", "status")
    assert res.exit_code in (0, 4) and "blank" not in res.stderr, res.stderr


@pytest.mark.parametrize("command", ["verify", "seal"])
def test_an_empty_path_is_a_usage_error_never_the_working_directory(
    cli: CliRunner, command: str, demo_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(demo_run / "step-30")  # a checkpoint drill would otherwise verify or seal
    before = sorted(p.name for p in (demo_run / "step-30").iterdir())
    res = invoke(cli, command, "")
    assert res.exit_code == 2 and "blank: nothing given" in res.stderr, res.stderr
    assert sorted(p.name for p in (demo_run / "step-30").iterdir()) == before


def test_verify_of_a_directory_of_runs_names_them_and_reads_none_of_their_manifests(
    cli: CliRunner, demo_run: Path, tmp_path: Path
) -> None:
    """``drill verify ~/runs``: exit 2 naming the runs, as for one run directory — not a verdict
    on the runs' own shard indexes read as if they were its own (they were checked against the
    wrong directory: "listed but missing")."""
    safetensors_torch = pytest.importorskip("safetensors.torch", reason="safetensors is not installed")
    runs = tmp_path / "runs"
    shutil.copytree(demo_run, runs / "demo")
    weights = runs / "export" / "step-1"
    weights.mkdir(parents=True)
    safetensors_torch.save_file({"w": torch.ones(2)}, str(weights / "model-00001-of-00001.safetensors"))
    index = {"metadata": {}, "weight_map": {"w": "model-00001-of-00001.safetensors"}}
    (weights / "model.safetensors.index.json").write_text(json.dumps(index))
    res = invoke(cli, "verify", str(runs))
    assert res.exit_code == 2 and "a directory of runs or checkpoints (demo, export)" in res.stderr, res.stderr
    res = invoke(cli, "verify", str(runs / "export"), "--json")
    assert res.exit_code == 2 and "run directory holding checkpoints (step-1)" in res.stderr, res.stderr


def test_unreachable_database_exits_4_without_secrets(cli: CliRunner, demo_run: Path) -> None:
    res = invoke(cli, "run", "--root", str(demo_run), "--db", "postgresql://u:hunter2@127.0.0.1:1/x")
    assert res.exit_code == 4
    assert "cannot reach database" in res.stderr and "hunter2" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error for a host without CUDA")
def test_cuda_on_a_cpu_host_is_a_usage_error(cli: CliRunner, demo_run: Path, sqlite_url: str) -> None:
    res = invoke(cli, "run", "--root", str(demo_run), "--device", "cuda", "--db", sqlite_url)
    assert res.exit_code == 2 and "CUDA is not available" in res.stderr


@pytest.mark.slow
def test_history_and_show(cli: CliRunner, demo_run: Path, db_url: str, tmp_path: Path) -> None:
    invoke(cli, "run", "--root", str(demo_run), "--no-replay", "--db", db_url)
    (tmp_path / "inc" / "step-5").mkdir(parents=True)
    (tmp_path / "inc" / "step-5" / "__0_0.distcp").write_bytes(b"partial")
    invoke(cli, "run", "--root", str(tmp_path / "inc"), "--db", db_url)  # only an unfinished save: failed, recorded
    res = invoke(cli, "history", "--json", "--db", db_url)
    docs = json.loads(res.stdout)
    assert [d["status"] for d in docs] == ["failed", "passed"]
    only = json.loads(invoke(cli, "history", "--root", str(demo_run), "--json", "--db", db_url).stdout)
    assert [d["id"] for d in only] == [docs[1]["id"]]

    table = invoke(cli, "history", "--db", db_url)
    assert table.exit_code == 0 and "PASSED" in table.stdout and "FAILED" in table.stdout

    shown = json.loads(invoke(cli, "show", str(docs[1]["id"]), "--json", "--db", db_url).stdout)
    assert [c["name"] for c in shown["checks"]] == [
        "discover",
        "resume",
        "integrity",
        "durable",
        "files",
        "load",
        "keys",
        "contract",
        "replay",
    ]
    assert shown["checks"][-1]["status"] == "skipped" and shown["replay"]["verdict"] == "not run"
    assert shown["checks"][4]["evidence"]["files_ok"] == 3
    assert shown["evidence_level"] == "sealed" and shown["sample"] == "all"
    missing = invoke(cli, "show", "9999", "--db", db_url)
    assert missing.exit_code == 2 and "no drill with id 9999" in missing.stderr


def test_history_of_an_empty_database(cli: CliRunner, sqlite_url: str) -> None:
    res = invoke(cli, "history", "--db", sqlite_url)
    assert res.exit_code == 0 and res.stdout == "" and "no drills recorded" in res.stderr


def test_db_upgrade_and_status(cli: CliRunner, postgres_url: str) -> None:
    status = invoke(cli, "db", "status", "--db", postgres_url)
    assert status.exit_code == 4 and "behind" in status.stdout
    res = invoke(cli, "db", "upgrade", "--db", postgres_url)
    assert res.exit_code == 0 and f"upgraded from empty to {head_revision()}" in res.stdout
    again = invoke(cli, "db", "upgrade", "--db", postgres_url)
    assert "up to date" in again.stdout
    status = invoke(cli, "db", "status", "--json", "--db", postgres_url)
    assert status.exit_code == 0 and json.loads(status.stdout)["current"] == head_revision()


def test_run_against_a_postgres_schema_that_is_behind(cli: CliRunner, demo_run: Path, postgres_url: str) -> None:
    res = invoke(cli, "run", "--root", str(demo_run), "--db", postgres_url)
    assert res.exit_code == 4 and "drill db upgrade" in res.stderr


@pytest.mark.slow
def test_demo_command(cli: CliRunner, tmp_path: Path) -> None:
    res = invoke(cli, "demo", str(tmp_path / "run"), "--steps", "6", "--save-every", "2", "--keep", "2", "--json")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["retained"] == ["step-4", "step-6"] and doc["saved"] == [2, 4, 6]
    again = invoke(cli, "demo", str(tmp_path / "run"))
    assert again.exit_code == 2 and "not an empty directory" in again.stderr
    bad = invoke(cli, "demo", str(tmp_path / "other"), "--keep", "0")
    assert bad.exit_code == 2 and "keep-last-0" in bad.stderr


def test_internal_errors_are_one_line_unless_debug(
    cli: CliRunner, demo_run: Path, sqlite_url: str, monkeypatch
) -> None:
    import drill.records.store as store

    def boom(*a, **k):
        raise RuntimeError("kaboom")

    from drill.records.db import open_database

    open_database(sqlite_url).close()
    monkeypatch.setattr(store.Records, "history", boom)
    res = invoke(cli, "history", "--db", sqlite_url)
    assert res.exit_code == 70
    assert (
        res.stderr.strip()
        == "drill: error: internal error: RuntimeError: kaboom (re-run with --debug for the traceback)"
    )
    with pytest.raises(RuntimeError):
        invoke(cli, "history", "--db", sqlite_url, "--debug")


def test_version(cli: CliRunner) -> None:
    from drill import __version__

    assert invoke(cli, "--version").stdout.strip() == f"drill {__version__}"


def test_relative_root_is_recorded_absolute(cli: CliRunner, demo_run: Path, sqlite_url: str, monkeypatch) -> None:
    monkeypatch.chdir(demo_run.parent)
    assert invoke(cli, "run", "--root", "run", "--no-replay", "--db", sqlite_url).exit_code == 0
    (drill,) = json.loads(invoke(cli, "history", "--root", str(demo_run), "--json", "--db", sqlite_url).stdout)
    assert drill["checkpoint"]["uri"] == str(demo_run / "step-30")
    assert drill["run_root"] == str(demo_run)


def test_unexpected_failure_is_recorded_as_error_with_traceback(
    cli: CliRunner, demo_run: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import drill.formats.dcp as dcp_format

    def broken(*a, **k):
        raise RuntimeError("device fell off the bus")

    monkeypatch.setattr(dcp_format.DCP, "restore", broken)
    res = invoke(cli, "run", "--root", str(demo_run), "--no-replay", "--json", "-q", "--db", sqlite_url)
    assert res.exit_code == 5
    assert res.stderr.strip() == "drill: error: RuntimeError: device fell off the bus"
    doc = json.loads(res.stdout)
    assert doc["status"] == "error" and doc["phase"] == "restore"
    assert [c["status"] for c in doc["checks"][2:]] == ["skipped"] * 7  # not checked: the drill ended during restore
    shown = json.loads(invoke(cli, "show", str(doc["id"]), "--json", "--db", sqlite_url).stdout)
    assert shown.pop("seal")["state"] == "intact"
    assert shown == doc and "Traceback" in shown["error"]


def test_seal_and_verify_commands(cli: CliRunner, demo_run: Path, sqlite_url: str) -> None:
    ckpt = demo_run / "step-20"
    os.remove(ckpt / "drill-manifest.json")
    unsealed = invoke(cli, "verify", str(ckpt), "--db", sqlite_url)
    assert unsealed.exit_code == 0 and "unsealed: structurally consistent" in unsealed.stdout
    strict = invoke(cli, "verify", str(ckpt), "--require-sealed", "--db", sqlite_url)
    assert strict.exit_code == 1 and "not-sealed" in strict.stdout

    sealed = invoke(cli, "seal", str(ckpt), "--json")
    assert sealed.exit_code == 0 and json.loads(sealed.stdout)["written"] is True
    assert "already sealed" in invoke(cli, "seal", str(ckpt)).stdout
    doc = json.loads(invoke(cli, "verify", str(ckpt), "--json", "--db", sqlite_url).stdout)
    assert doc["status"] == "passed" and doc["evidence"]["coverage"]["percent"] == 100.0

    (ckpt / "__0_0.distcp").write_bytes(b"x")
    conflict = invoke(cli, "seal", str(ckpt))
    assert conflict.exit_code == 1 and "seals different content" in conflict.stderr
    bad = invoke(cli, "verify", str(ckpt), "--db", sqlite_url)
    assert bad.exit_code == 1 and "size-mismatch [__0_0.distcp]" in bad.stdout
    assert bad.stderr.startswith("drill: failed: __0_0.distcp is truncated")
    assert invoke(cli, "verify", str(demo_run / "nope"), "--db", sqlite_url).exit_code == 3
    assert invoke(cli, "verify", str(ckpt), "--sample", "9/4", "--db", sqlite_url).exit_code == 2


def test_run_sampled_says_so(cli: CliRunner, demo_run: Path, sqlite_url: str) -> None:
    res = invoke(cli, "run", "--root", str(demo_run), "--sample", "1/3", "--no-replay", "--json", "--db", sqlite_url)
    assert res.exit_code == 0
    integrity = next(c for c in json.loads(res.stdout)["checks"] if c["name"] == "integrity")
    assert "sampled 1/3" in integrity["summary"]


def test_a_drill_left_running_by_a_dead_process_is_closed_as_aborted(demo_run: Path, sqlite_url: str) -> None:
    import subprocess
    import sys
    from datetime import datetime, timezone

    from drill import get_drill
    from drill.pipeline.recorder import DrillStart
    from drill.records.db import open_database
    from drill.records.store import Records

    records = Records(open_database(sqlite_url))
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout
    start = DrillStart(
        run_root="/r",
        selector="latest",
        trigger="manual",
        device="cpu",
        policy=None,
        started_at=datetime.now(timezone.utc),
        versions={},
    )
    orphan = records.begin_drill(start, pid=int(dead))
    records.db.close()
    drill(demo_run, sqlite_url)
    got = get_drill(orphan, db=sqlite_url)
    assert got.status == "aborted" and f"pid {int(dead)}" in got.message and "is gone" in got.message


COMMAND_MODULES = {"audit", "demo", "integrity", "nightly", "records", "reports", "run", "submit"}


@pytest.mark.parametrize(
    ("argv", "loaded"),
    [
        (["verify", "--help"], {"integrity"}),
        (["db", "status", "--help"], {"records"}),
        (["audit", "--help"], {"audit"}),
        (["--help"], COMMAND_MODULES - {"audit"}),  # audit is a group: its commands load with its own help
    ],
)
def test_a_command_imports_only_its_own_module(argv: list[str], loaded: set[str]) -> None:
    """Commands are built when looked up: `drill verify` pays for no other command's imports,
    while a listing loads the commands it lists."""
    from tests.conftest import fresh_python

    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print(','.join(sorted(m.rsplit('.', 1)[-1] for m in sys.modules if m.startswith('drill.cli.')))))\n"
        f"sys.argv = ['drill', *{argv!r}]\n"
        "from drill.cli import main\nmain()\n"
    )
    assert set(fresh_python(code).split(",")) & COMMAND_MODULES == loaded


def test_cli_conventions_a_new_user_expects(cli: CliRunner, demo_run: Path, sqlite_url: str) -> None:
    """-h beside --help on every command, shell completion, an unknown --status naming the
    verdicts, comma-separated --allow-missing, and help examples that name files that exist."""
    import re

    from typer.main import get_command

    from drill.cli.app import app

    root = invoke(cli, "-h")
    assert root.exit_code == 0 and "Usage: drill" in root.stdout and "--install-completion" in root.stdout
    group = get_command(app)
    for name in group.commands:
        res = invoke(cli, name, "-h")
        assert res.exit_code == 0 and "Usage:" in res.stdout, name
        for policy in re.findall(r"policies/[\w./-]+\.yaml", res.stdout):
            assert (Path(__file__).resolve().parent.parent / policy).is_file(), (name, policy)
    bogus = invoke(cli, "history", "--status", "bogus", "--db", sqlite_url)
    assert bogus.exit_code == 2 and "passed, failed, slo_breach, error, aborted" in bogus.stderr
    both = invoke(
        cli,
        "run",
        "--root",
        str(demo_run),
        "--allow-missing",
        "rng,dataloader",
        "--no-replay",
        "--json",
        "-q",
        "--db",
        sqlite_url,
    )
    assert both.exit_code == 0 and json.loads(both.stdout)["options"]["allow_missing"] == ["rng", "dataloader"]


@pytest.mark.slow
def test_history_fits_80_columns_and_drill_runs_shows_the_whole_run(demo_run: Path, sqlite_url: str) -> None:
    import io

    from rich.console import Console

    from drill import history
    from drill.cli.render import render_history

    drill(demo_run, sqlite_url)
    drill(demo_run, sqlite_url, "step:20")
    buf = io.StringIO()
    render_history(Console(file=buf, width=80, force_terminal=False), history(db=sqlite_url))
    assert max(len(line) for line in buf.getvalue().splitlines()) <= 80, buf.getvalue()
    cli = CliRunner()
    one = invoke(cli, "runs", str(demo_run), "--db", sqlite_url)
    assert one.exit_code == 0
    rows = {line.split()[0]: line for line in one.stdout.splitlines() if line.startswith("step-")}
    assert set(rows) == {"step-10", "step-20", "step-30"} and "never" in rows["step-10"] and "sealed" in rows["step-30"]
    doc = json.loads(invoke(cli, "runs", "--json", "--db", sqlite_url).stdout)
    assert doc["runs"][0]["coverage"]["never_drilled"] == ["step-10"]


@pytest.mark.parametrize("command", [["run"], ["last-good"], ["burst"]])
@pytest.mark.parametrize("root", ["absent", "a-file"])
def test_every_command_that_lists_a_run_says_its_root_is_not_there(
    cli: CliRunner, tmp_path: Path, sqlite_url: str, command: list[str], root: str
) -> None:
    """One way to list a run (``drill.api.list_run``): ``drill burst --root missing`` was an
    internal error (exit 70, ``FileNotFoundError``) where ``run`` and ``last-good`` said exit 3."""
    (tmp_path / "a-file").write_text("x")
    res = invoke(cli, *command, "--root", str(tmp_path / root), "--db", sqlite_url)
    assert res.exit_code == 3, (res.exit_code, res.stderr)
    assert f"drill: error: run root {tmp_path / root} does not exist or is not a directory" in res.stderr
    assert "internal error" not in res.stderr


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["history", "--since", "99999999d"], 0, ""),  # since the beginning of time (was exit 70)
        (["report", "--since", "99999999999d", "-f", "json"], 0, ""),  # (was exit 70)
        (["report", "--until", "9999-12-31", "-f", "json"], 0, ""),  # the end of the last day there is
        (["report", "--since", "0001-01-01T00:00+01:00"], 2, "lies outside the years 1 to 9999 in UTC"),
        (["history", "--since", "9999-12-31T23:59-05:00"], 2, "lies outside the years 1 to 9999 in UTC"),
    ],
)
def test_a_time_window_at_the_edge_of_the_calendar_is_an_answer_or_a_usage_error(
    cli: CliRunner, sqlite_url: str, args: list[str], code: int, says: str
) -> None:
    res = invoke(cli, *args, "--db", sqlite_url)
    assert res.exit_code == code and says in res.stderr, (res.exit_code, res.stderr)
    assert "internal error" not in res.stderr


def test_a_coverage_window_past_the_calendar_is_all_of_time(tmp_path: Path) -> None:
    """``--coverage-days 1e300`` on a sampled verification (where the window is looked at): every
    proof counts, not an ``OverflowError``."""
    from datetime import datetime, timezone

    from drill.units import earlier

    now = datetime.now(timezone.utc)
    assert earlier(now, 1e300 * 86400) == datetime.min.replace(tzinfo=timezone.utc)
    assert earlier(now, 60) < now


@pytest.mark.parametrize(
    "doc",
    [
        '{"status": "passed", "exit_code": 1e400}',
        '{"status": "passed", "exit_code": true}',
        '{"status": "passed", "exit_code": 1.5}',
        '{"status": "passed", "exit_code": "0"}',
        '{"status": "passed", "exit_code": null}',
        '{"status": "passed", "exit_code": 99}',
        '{"status": 7, "exit_code": 0}',
        '{"status": "passed", "exit_code": 0, "rank": "zero"}',
        '{"status": "passed", "exit_code": 0, "message": ["a"]}',
        '[{"status": "passed", "exit_code": 0}]',
        '"passed"',
        '{"status": "failed", "exit_code": 0}',  # a status and a code that disagree: exited 0
        '{"status": "passed", "exit_code": 1}',
        '{"status": "error", "exit_code": 0}',
        '{"status": "aborted", "exit_code": 5}',
        '{"status": "running", "exit_code": 5}',
        '{"status": "fine", "exit_code": 0}',  # an unknown status: exited 0
    ],
)
def test_a_verdict_file_of_any_other_shape_is_no_verdict(tmp_path: Path, doc: str) -> None:
    """A launcher's step: only what ``drill run --verdict-file`` writes sets the exit code —
    ``1e400`` was an internal ``OverflowError``, ``true`` and ``1.5`` passed as 1."""
    (f := tmp_path / "v.json").write_text(doc)
    res = invoke(CliRunner(), "verdict", str(f))
    assert res.exit_code == 5 and "holds no drill verdict" in res.stderr, res.stderr


def test_the_verdict_file_drill_writes_reads_back_with_its_exit_code(tmp_path: Path) -> None:
    from drill.launch.verdict import VerdictFile, write_verdict
    from drill.verdict import EXIT_CODES

    write_verdict(str(f := tmp_path / "v.json"), VerdictFile(12, "failed", 1, "a shard is truncated", 3))
    res = invoke(CliRunner(), "verdict", str(f))
    assert res.exit_code == 1 and "#12" in res.stderr and "failed" in res.stderr, res.stderr
    for status, codes in EXIT_CODES.items():  # every status and code a drill ends with reads back
        for code in codes:
            write_verdict(str(f), VerdictFile(1, status.value, int(code), None))
            assert invoke(CliRunner(), "verdict", str(f)).exit_code == code


NAMED_FILES = [
    (["policy", "check", "{f}"], 2, "{f}: cannot read: not a regular file"),
    (["submit", "--policy", "{f}"], 2, "{f}: cannot read: not a regular file"),
    (["scheduler", "start", "{f}"], 2, "{f}: cannot read: not a regular file"),
    (["run", "--policy", "{f}"], 2, "{f}: cannot read: not a regular file"),
    (["verdict", "{f}"], 5, "{f} holds no drill verdict (not a regular file"),
    (["seal", "{ckpt}", "--key-file", "{f}"], 2, "the seal key file {f} cannot be read (not a regular file"),
    (["verify", "{ckpt}", "--key-file", "{f}"], 2, "the seal key file {f} cannot be read (not a regular file"),
    (
        ["run", "--root", "{run}", "--no-replay", "--key-file", "{f}"],
        2,
        "the seal key file {f} cannot be read (not a regular file",
    ),
    (["audit", "verify"], 2, "the audit key file {f} cannot be read (not a regular file"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["fifo", "device"])
@pytest.mark.parametrize(("argv", "code", "says"), NAMED_FILES, ids=[" ".join(a[:2]) for a, _, _ in NAMED_FILES])
def test_a_file_named_to_drill_that_is_a_fifo_or_a_device_is_refused_unopened(
    tmp_path: Path, demo_run: Path, sqlite_url: str, kind: str, argv: list[str], code: int, says: str
) -> None:
    """A policy, a verdict or a key file that is a FIFO blocked every one of these commands
    forever (waiting for a writer); ``/dev/zero`` would never end. Each is read one way
    (``drill.storage.local.read_regular``): exit ``code``, one line, never opened for reading."""
    if kind == "fifo":
        os.mkfifo(f := str(tmp_path / "named"))
    else:
        f = "/dev/zero"
    env = {**os.environ, "DRILL_DATABASE_URL": sqlite_url}
    if argv[0] == "audit":  # the audit chain's key, named in the environment
        env["DRILL_AUDIT_KEY_FILE"] = f
    args = [a.format(f=f, ckpt=demo_run / "step-30", run=demo_run) for a in argv]
    res = subprocess.run(
        [sys.executable, "-m", "drill", *args], capture_output=True, text=True, env=env, timeout=90, cwd=tmp_path
    )  # a subprocess: a regression hangs on the FIFO, and the timeout ends it as a failure
    assert res.returncode == code, (res.returncode, res.stderr)
    assert says.format(f=f) in res.stderr, res.stderr
    said = next(line for line in res.stderr.splitlines() if says.format(f=f) in line)
    assert said.count(f) == 1, res.stderr  # the path named once, with why
    assert "Traceback" not in res.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
@pytest.mark.parametrize("command", [["history"], ["verify", "{ckpt}"], ["run", "--root", "{run}", "--no-replay"]])
def test_a_database_that_is_no_file_is_refused_before_it_is_opened(
    tmp_path: Path, demo_run: Path, kind: str, command: list[str]
) -> None:
    """``--db`` (or ``$DRILL_DATABASE_URL``) naming a FIFO blocked every command in SQLite's
    open, past SIGTERM; ``/dev/null`` was read as an empty database. Exit 2, one line, from
    where the URL is resolved (``drill.records.urls.resolve_url``)."""
    target = {"fifo": str(tmp_path / "db.fifo"), "device": "/dev/null", "directory": str(tmp_path)}[kind]
    if kind == "fifo":
        os.mkfifo(target)
    args = [a.format(ckpt=demo_run / "step-30", run=demo_run) for a in command]
    for how in (["--db", target], ["--db", f"sqlite:///{target}"]):
        res = subprocess.run(
            [sys.executable, "-m", "drill", *args, *how], capture_output=True, text=True, timeout=90, cwd=tmp_path
        )
        assert res.returncode == 2, (how, res.returncode, res.stderr)
        assert res.stderr.strip().splitlines()[-1].endswith("not an SQLite database file"), res.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "url", ["sqlite:///:memory:", "sqlite://", "sqlite:///file::memory:?cache=shared", "sqlite:///x.db?mode=memory"]
)
def test_an_in_memory_database_is_refused_as_no_record(tmp_path: Path, demo_run: Path, url: str) -> None:
    """An in-memory SQLite URL kept nothing: ``verify`` was exit 4 "no such table" (the
    migrations ran on one connection's database, the ledger read another's), ``run`` spooled
    its verdict as if the database were down, ``history`` answered "no drills recorded". Exit
    2, one line, from ``--db`` and ``$DRILL_DATABASE_URL`` alike; nothing spooled."""
    spool = tmp_path / "spool"
    env = {**os.environ, "DRILL_SPOOL_DIR": str(spool)}
    env.pop("DRILL_DATABASE_URL", None)
    for args in (["history"], ["verify", str(demo_run / "step-30")], ["run", "--root", str(demo_run), "--no-replay"]):
        for how, extra in ((["--db", url], {}), ([], {"DRILL_DATABASE_URL": url})):
            res = subprocess.run(
                [sys.executable, "-m", "drill", *args, *how],
                capture_output=True,
                text=True,
                timeout=90,
                cwd=tmp_path,
                env={**env, **extra},
            )
            assert res.returncode == 2, (args, how, res.returncode, res.stderr)
            assert (
                res.stderr.strip()
                .splitlines()[-1]
                .endswith("keeps no record past the command that opened it: name a file")
            )
    assert not spool.exists() or not any(spool.iterdir()), list(spool.iterdir())


def _strict(text: str):  # type: ignore[no-untyped-def]
    def refuse(constant: str):  # type: ignore[no-untyped-def]
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_json_on_stdout_and_to_alert_receivers_is_strict_even_where_a_figure_is_not_finite(
    cli: CliRunner, sqlite_url: str
) -> None:
    """``drill goodput --json --blocking-s 1e300`` printed ``Infinity`` (and a replay's NaN loss
    reached an alert's receiver as ``NaN``): jq and strict parsers reject both. Every JSON drill
    writes goes through the records' encoding: the strings ``"Infinity"``/``"NaN"``."""
    from drill.findings import strict_json

    res = invoke(cli, "goodput", "--gpus", "1", "--blocking-s", "1e300", "--json", "--db", sqlite_url)
    assert res.exit_code == 0, res.stderr
    doc = _strict(res.stdout)
    assert "Infinity" in json.dumps(doc) and '"Infinity"' in res.stdout
    assert _strict(strict_json({"loss": float("nan"), "rate": float("-inf")})) == {"loss": "NaN", "rate": "-Infinity"}


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        (["verify", "{ckpt}", "--db", "{long}"], 2, "a path longer than this system allows"),  # was exit 70
        (["history", "--db", "{long}"], 2, "a path longer than this system allows"),
        (["run", "--root", "{long}"], 3, "does not exist or is not a directory"),  # was exit 5, "storage unavailable"
        (["verify", "{long}"], 3, "does not exist"),
        (["burst", "--root", "{long}"], 3, "does not exist or is not a directory"),
    ],
)
def test_a_path_longer_than_the_system_allows_is_not_there_never_an_internal_or_storage_error(
    cli: CliRunner, demo_run: Path, tmp_path: Path, sqlite_url: str, argv: list[str], code: int, says: str
) -> None:
    long = str(tmp_path / ("a" * 5000))  # ENAMETOOLONG from every system call that takes it
    args = [a.format(ckpt=demo_run / "step-30", long=long) for a in argv]
    res = invoke(cli, *args, *([] if "--db" in args else ["--db", sqlite_url]))
    assert res.exit_code == code and says in res.stderr, (res.exit_code, res.stderr[-300:])
    assert "internal error" not in res.stderr and "storage unavailable" not in res.stderr


PLAIN_LINES: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("integrity",), {"end": " ", "style": "bold"}),
    (("PASSED",), {"end": "  ", "style": "bold green"}),
    (("tab\there\tand\tthere", "\tled"), {}),
    (("evil\x1b[2J\x1b[31mPASSED\x1b[0m\x07", "cr\rx", "del\x7f"), {"sep": " | "}),
    (("bidi\u202etxt", "not-utf8-\udcff\udcfe", "c1-\x9b31m", "\ufeffbom"), {}),
    (("[bold]not markup[/] [red]x :fire: \\[escaped] [link=http://x]y",), {"style": "dim"}),
    (("multi\nline\n\ttabbed\n",), {"end": ""}),
    (("wide: 漢字 é e\u0301 \U0001f525", "x" * 300), {}),
    (("",), {}),
    ((), {}),
]


@pytest.mark.parametrize(("objects", "kw"), PLAIN_LINES)
@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_plain_line_is_written_exactly_as_rich_writes_it_where_rich_styles_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, stream: str, objects: tuple, kw: dict
) -> None:
    """A pipe or a file: drill's console writes plain text (``markup=False``) itself, without
    loading rich; what it writes is what rich writes there, character for character — control
    characters escaped, tabs expanded, nothing wrapped, no markup or emoji interpreted."""
    from drill.cli.common import Out

    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    out = Out(stream)
    assert out.plain
    out.print(*objects, markup=False, **kw)
    ours = getattr(capsys.readouterr(), "out" if stream == "stdout" else "err")
    out.rich.print(*objects, markup=False, **kw)
    assert ours == getattr(capsys.readouterr(), "out" if stream == "stdout" else "err")


@pytest.mark.parametrize(
    ("env", "terminal", "plain"),
    [
        ({}, False, True),
        ({}, True, False),
        ({"FORCE_COLOR": "1"}, False, False),
        ({"FORCE_COLOR": ""}, False, False),  # rich's to decide
        ({"TTY_COMPATIBLE": "1"}, False, False),
        ({"TTY_COMPATIBLE": "0"}, True, False),
    ],
)
def test_only_output_rich_would_not_style_is_written_without_it(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], terminal: bool, plain: bool
) -> None:
    """A terminal, or an environment that makes rich treat a stream as one (whatever the value:
    rich's to read), is rich's; so are markup and anything that is not a string."""
    from drill.cli import common

    for name in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    main, other = os.openpty() if terminal else os.pipe()
    try:
        with open(other, "w", closefd=False) as stream:
            assert common.unstyled(stream) is plain
            monkeypatch.setattr(sys, "stdout", stream)
            out = common.Out("stdout")
            assert out.plain is plain
            seen: list[tuple] = []
            monkeypatch.setattr(common.Out, "rich", type("Spy", (), {"print": lambda *a, **k: seen.append(a)})())
            out.print("[bold]x[/]")  # markup: rich's
            out.print(3, markup=False)  # not a string: rich's
            assert len(seen) == 2
    finally:
        os.close(main)
        os.close(other)
