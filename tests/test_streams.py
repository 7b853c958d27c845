"""drill started in a broken process environment. A standard stream closed (``drill verify
CKPT >&-``, a supervisor that starts it without them): the command runs as if the stream were
/dev/null — the same exit code, never a traceback, and no file of drill's (its database) takes
the closed stream's number. Output that cannot be written: one line and exit 5. A working
directory that was removed: one line and exit 2, before anything (torch's own start-up
included) trips on it."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from drill.integrity.manifest import seal_files as seal

pytestmark = pytest.mark.slow  # every test runs drill as a whole process, some twice

CLOSED = {
    "stdout": (1,),
    "stderr": (2,),
    "stdin": (0,),
    "all three": (0, 1, 2),
}


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import drill.sdk

    g = torch.Generator().manual_seed(0)
    state = {f"p{i}": torch.randn(4096, generator=g) for i in range(8)}
    ckpt = tmp_path_factory.mktemp("streams") / "step-8"
    drill.sdk.save(state, str(ckpt), no_dist=True, single_file_per_rank=False, sync_files=False)
    seal(ckpt, force=True)
    return ckpt


def _damaged(ckpt: Path, tmp: Path) -> Path:
    import shutil

    copy = tmp / "damaged"
    shutil.copytree(ckpt, copy)
    shard = min(p for p in copy.iterdir() if p.suffix == ".distcp")
    data = bytearray(shard.read_bytes())
    data[-100] ^= 0x01
    shard.write_bytes(data)
    return copy


def _drill(args: list[str], closed: tuple[int, ...], cwd: Path) -> subprocess.CompletedProcess[str]:
    def close() -> None:
        for fd in closed:
            os.close(fd)

    return subprocess.run(
        [sys.executable, "-m", "drill", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        preexec_fn=close,  # after the pipes are in place: the closed ones are closed in drill
        text=True,
        timeout=300,
        cwd=cwd,
    )


COMMANDS: dict[str, tuple[Callable[[Path, Path], list[str]], int]] = {
    "verify (its workers forked)": (lambda ckpt, tmp: ["verify", str(ckpt), "--db", f"sqlite:///{tmp}/v.db"], 0),
    "verify --json": (lambda ckpt, tmp: ["verify", str(ckpt), "--json", "--db", f"sqlite:///{tmp}/v.db"], 0),
    "verify, damaged": (
        lambda ckpt, tmp: ["verify", str(_damaged(ckpt, tmp)), "--db", f"sqlite:///{tmp}/v.db"],
        1,
    ),
    "verify, nothing there": (lambda ckpt, tmp: ["verify", str(tmp / "absent")], 3),
    "a bad option": (lambda ckpt, tmp: ["verify", str(ckpt), "--bogus"], 2),
    "--version": (lambda ckpt, tmp: ["--version"], 0),
}


@pytest.fixture(scope="module")
def opened(sealed: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[list[str], Any]]:
    """Each command's arguments and its run with every stream open, made once for the module."""
    tmp = tmp_path_factory.mktemp("commands")
    done: dict[str, tuple[list[str], Any]] = {}

    def run(command: str) -> tuple[list[str], Any]:
        if command not in done:
            make, code = COMMANDS[command]
            args = make(sealed, tmp)
            got = _drill(args, (), tmp)
            assert got.returncode == code, got.stderr
            done[command] = args, got
        return done[command]

    return run


@pytest.mark.parametrize("closed", CLOSED)
@pytest.mark.parametrize("command", COMMANDS)
def test_a_closed_standard_stream_changes_no_exit_code_and_shows_no_traceback(
    opened: Callable[[str], tuple[list[str], Any]], tmp_path: Path, command: str, closed: str
) -> None:
    code = COMMANDS[command][1]
    args, opened_run = opened(command)
    done = _drill(args, CLOSED[closed], tmp_path)
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    if 2 not in CLOSED[closed]:
        assert done.stderr == opened_run.stderr
    if 1 in CLOSED[closed]:
        assert done.stdout == ""  # discarded, as into /dev/null: never into a file drill opened
    db = next((Path(a.removeprefix("sqlite:///")) for a in args if a.startswith("sqlite:///")), None)
    if db is not None and db.exists():
        with sqlite3.connect(db) as con:
            assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_the_stream_in_a_closed_ones_place_is_dev_null(tmp_path: Path) -> None:
    """In the process: the closed descriptor is /dev/null again, Python's stream for it is a
    stream again, and the next file opened takes a number above the three."""
    code = (
        "import os, sys\n"
        "from drill.proc import standard_streams\n"
        "assert sys.stdout is None\n"
        "standard_streams()\n"
        "print('discarded')\n"
        "sys.stdout.flush()\n"
        "same = os.path.samestat(os.fstat(1), os.stat(os.devnull))\n"
        "fd = os.open(os.devnull, os.O_RDONLY)\n"
        "sys.stderr.write(f'{same} {fd > 2} {sys.__stdout__ is sys.stdout}')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        preexec_fn=lambda: os.close(1),
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "True True True"


def _written(args: list[str], cwd: Path, stdout: Any = None, stderr: Any = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "drill", *args],
        stdin=subprocess.DEVNULL,
        stdout=stdout if stdout is not None else subprocess.PIPE,
        stderr=stderr if stderr is not None else subprocess.PIPE,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def _reader_gone() -> tuple[int, int]:
    """A pipe whose reader has gone: every write to it fails (EPIPE)."""
    r, w = os.pipe()
    os.close(r)
    return r, w


@pytest.mark.parametrize("where", ["a full disk (/dev/full)", "a pipe whose reader went away"])
@pytest.mark.parametrize("command", ["verify (its workers forked)", "verify --json", "verify, damaged", "--version"])
def test_output_that_cannot_be_written_is_one_line_and_exit_5_never_a_verdict(
    opened: Callable[[str], tuple[list[str], Any]], tmp_path: Path, command: str, where: str
) -> None:
    """Whatever the command would have said — a pass, a failure — an output that could not be
    written is that: exit 5 and one line naming it, never exit 0 or 1 for a verdict no one
    received, never an internal error or a traceback."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    args, _ = opened(command)
    if where.startswith("a full disk"):
        with open("/dev/full", "w") as full:
            done = _written(args, tmp_path, stdout=full)
        why = "No space left on device"
    else:
        _, w = _reader_gone()
        try:
            done = _written(args, tmp_path, stdout=w)
        finally:
            os.close(w)
        why = "Broken pipe"
    assert done.returncode == 5, done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"drill: error: cannot write to stdout: {why}", done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr


@pytest.mark.parametrize("command", ["verify (its workers forked)", "verify, damaged", "a bad option"])
def test_an_unwritable_stderr_changes_neither_the_exit_code_nor_stdout(
    opened: Callable[[str], tuple[list[str], Any]], tmp_path: Path, command: str
) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    code = COMMANDS[command][1]
    args, opened_run = opened(command)
    with open("/dev/full", "w") as full:
        done = _written(args, tmp_path, stderr=full)
    assert done.returncode == opened_run.returncode == code
    untimed = re.compile(r"hashed in [^;]*;")
    assert untimed.sub("", done.stdout) == untimed.sub("", opened_run.stdout)
    assert (done.stdout != "") == (code in (0, 1))  # a verdict printed; a usage error prints none


def _in_a_removed_directory(tmp: Path) -> Callable[[], None]:
    gone = tmp / "gone"

    def enter() -> None:
        gone.mkdir()
        os.chdir(gone)
        os.rmdir(gone)

    return enter


@pytest.mark.parametrize(
    "args",
    [
        ["verify", "step-8"],
        ["verify", "ABS"],
        ["history", "--db", "sqlite:///rel.db"],
        ["demo", "./run"],
        ["--version"],
    ],
    ids=["a relative checkpoint", "an absolute one", "a relative database", "the demo (imports torch)", "--version"],
)
def test_a_removed_working_directory_is_one_line_and_exit_2(sealed: Path, tmp_path: Path, args: list[str]) -> None:
    args = [str(sealed) if a == "ABS" else a for a in args]
    done = subprocess.run(
        [sys.executable, "-m", "drill", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        preexec_fn=_in_a_removed_directory(tmp_path),
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "drill: error: the working directory no longer exists",
        "hint: cd to a directory that exists",
    ]


def test_a_working_directory_removed_while_drill_runs_is_a_usage_error_not_an_internal_one(
    sealed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Removed after drill started: what then trips on it (a relative path resolved) is the
    same one line, exit 2, never an internal error."""
    from typer.testing import CliRunner

    from drill.cli.app import app

    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)  # and back to where the suite was, after
    gone.rmdir()
    result = CliRunner().invoke(app, ["verify", "step-8", "--db", f"sqlite:///{tmp_path}/v.db"])
    assert result.exit_code == 2, result.output
    assert "the working directory no longer exists: a relative path cannot be resolved" in result.output
    assert "internal error" not in result.output


@pytest.mark.parametrize("command", ["seal", "verify, damaged", "verify --json"])
def test_a_terminal_that_cannot_show_a_character_gets_its_escape_never_an_error(
    opened: Callable[[str], tuple[list[str], Any]], sealed: Path, tmp_path: Path, command: str
) -> None:
    """An ASCII terminal (``PYTHONIOENCODING=ascii``): drill's arrows and dashes are written as
    their ``\\u`` escapes, the exit code is the command's own, JSON is still JSON."""
    import json

    if command == "seal":
        args, code = ["seal", str(sealed)], 0
    else:
        args, code = opened(command)[0], COMMANDS[command][1]
    done = subprocess.run(
        [sys.executable, "-m", "drill", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": "ascii"},
        timeout=300,
    )
    assert done.returncode == code, done.stderr
    assert b"internal error" not in done.stderr and b"Traceback" not in done.stderr
    done.stdout.decode("ascii")  # nothing but ASCII was written
    if command == "seal":
        assert b"\\u2192" in done.stdout  # the arrow, escaped
    if command == "verify --json":
        assert json.loads(done.stdout)["status"] == "passed"
