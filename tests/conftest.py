"""Shared fixtures: real demo checkpoints, real databases (SQLite and the live PostgreSQL)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from drill.demo import DemoConfig, train
from tests.support import pglock

# A run small enough to train in a second or two, with three retained checkpoints (10, 20,
# 30) and a step log that goes on to step 36, past the last save: the replay reference.
SMALL_RUN = DemoConfig(steps=36, save_every=10, keep=3)

# A suite started in the background by a shell without job control (``.ci/run &``, nohup)
# inherits SIGINT as ignored, and every process it starts would too: the tests that press Ctrl-C
# on a drill would then wait on a drill that never hears it. A handler, unlike "ignored", is
# reset to the default in each child the suite starts, so the children hear SIGINT as a terminal's.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

POSTGRES_URL = os.environ.get("DRILL_TEST_POSTGRES_URL", "postgresql+psycopg://127.0.0.1:5432/test")


@pytest.fixture(scope="session")
def pristine_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real demo run, trained once per session. Never modify it: copy it (``demo_run``)."""
    run_dir = tmp_path_factory.mktemp("pristine") / "run"
    train(run_dir, SMALL_RUN)
    return run_dir


@pytest.fixture
def demo_run(pristine_run: Path, tmp_path: Path) -> Path:
    """A private copy of the demo run that a test may break."""
    dst = tmp_path / "run"
    shutil.copytree(pristine_run, dst)
    return dst


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'drill.db'}"


def _postgres_available() -> str | None:
    from sqlalchemy import create_engine, text

    try:
        engine = create_engine(POSTGRES_URL, connect_args={"connect_timeout": 5})
        with pglock.holding(exclusive=False), engine.connect() as conn:  # not while another suite restarts it
            conn.execute(text("select 1"))
        engine.dispose()
        return None
    except Exception as exc:  # noqa: BLE001
        return str(exc).splitlines()[0]


@pytest.fixture(scope="session")
def postgres_reachable() -> None:
    problem = _postgres_available()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL at {POSTGRES_URL} is required in CI: {problem}")
        pytest.skip(f"PostgreSQL at {POSTGRES_URL} is not reachable: {problem}")


@pytest.fixture
def postgres_to_restart(postgres_reachable: None) -> Iterator[None]:
    """The live server to oneself: no other copy of the suite uses it while this test runs."""
    with pglock.holding(exclusive=True):
        yield


@pytest.fixture
def postgres_url(postgres_reachable: None, request: pytest.FixtureRequest) -> Iterator[str]:
    """A URL whose connections live in a fresh, empty schema, dropped afterwards."""
    from sqlalchemy import create_engine, text

    if "postgres_to_restart" in request.fixturenames:
        request.getfixturevalue("postgres_to_restart")  # held exclusively, before the schema
        held = contextlib.nullcontext()
    else:
        held = pglock.holding(exclusive=False)
    schema = f"drill_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_URL, pool_pre_ping=True)  # survives a test that restarts the server
    with held:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        try:
            yield f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"
        finally:
            with admin.begin() as conn:
                conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
            admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest) -> str:
    """Each record test runs on the embedded SQLite and on the live PostgreSQL."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    url = request.getfixturevalue("postgres_url")
    from drill.records.db import upgrade

    upgrade(url)  # a shared PostgreSQL is upgraded by its operator, never implicitly
    return url


@pytest.fixture
def cli() -> CliRunner:
    return CliRunner()


def fresh_python(code: str) -> str:
    """The last line ``code`` prints in an interpreter of its own (what it imported is its own)."""
    import subprocess
    import sys

    return (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        .stdout.strip()
        .splitlines()[-1]
    )


def invoke(runner: CliRunner, *args: str):
    from drill.cli.app import app

    return runner.invoke(app, list(args), catch_exceptions=False)


def drill(root: Path | str, db: str, selector: str = "latest", *, storage=None, progress=None, recorder=None, **kw):
    """One drill through the public API; the replay is off unless asked for."""
    from drill import DrillRequest, run_drill
    from drill.replay import ReplaySpec

    kw.setdefault("replay", ReplaySpec(enabled=False))
    request = DrillRequest(selector=selector, root=str(root), **kw)
    return run_drill(request, db=db, storage=storage, progress=progress, recorder=recorder)


def capped_drill(*args: str, gib: int = 2, timeout: float = 300) -> tuple[int, dict[str, Any]]:
    """``drill ARGS --json`` in a process of its own under a ``gib`` GiB address-space cap:
    an input that makes drill enumerate what it should count hits the cap (a MemoryError, not
    a verdict) instead of the machine. Returns the exit code and the outcome document."""
    import json
    import resource
    import subprocess
    import sys

    cap = gib << 30
    done = subprocess.run(
        [sys.executable, "-m", "drill", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap)),
    )
    assert "Traceback" not in done.stderr and "MemoryError" not in done.stderr, done.stderr[-2000:]
    return done.returncode, json.loads(done.stdout)


def recorded(db: str):
    """Every drill in the database, oldest first, with its checks."""
    from drill import get_drill, history

    return [get_drill(d.id, db=db) for d in reversed(history(db=db, limit=10_000))]


@pytest.fixture(autouse=True)
def private_spool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test spools undeliverable verdicts into its own directory."""
    spool = tmp_path / "spool"
    monkeypatch.setenv("DRILL_SPOOL_DIR", str(spool))
    return spool


# The fast lane (-m "not slow") leaves out what takes seconds: tests marked slow, whole modules
# marked slow (pytestmark), and every test that needs one of these fixtures, whose setup alone
# takes seconds wherever it first runs.
SLOW_FIXTURES = {
    "history_db": "tests/test_reports.py: five drills of a real run, recorded",
    "hf_run": "tests/test_formats.py: a run written by the Hugging Face Trainer",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if SLOW_FIXTURES.keys() & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


# Every finding any test makes, by code: the severities it was made at. A code missing from
# drill.catalogue, or made at a severity the catalogue does not list, fails the session (the static
# half of this check is tests/test_catalogue.py). Under pytest-xdist each worker hands what it saw
# to the controller, which judges the whole: a worker's own exit status would not fail the run.
_FINDINGS_SEEN: dict[str, set[str]] = {}


def pytest_configure(config: pytest.Config) -> None:
    from drill.findings import Finding

    made = Finding.__init__

    def observed(self: Finding, *args: object, **kwargs: object) -> None:
        made(self, *args, **kwargs)
        _FINDINGS_SEEN.setdefault(self.code, set()).add(getattr(self.severity, "value", str(self.severity)))

    Finding.__init__ = observed


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: unknown without it
def pytest_testnodedown(node: Any, error: object) -> None:
    """On the controller: merge what a worker saw (called by pytest-xdist)."""
    for code, severities in getattr(node, "workeroutput", {}).get("findings_seen", {}).items():
        _FINDINGS_SEEN.setdefault(code, set()).update(severities)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from drill.catalogue import CODES

    if hasattr(session.config, "workeroutput"):  # a worker: the controller judges
        session.config.workeroutput["findings_seen"] = {c: sorted(s) for c, s in _FINDINGS_SEEN.items()}
        return
    wrong = []
    for code, severities in sorted(_FINDINGS_SEEN.items()):
        entry = CODES.get(code)
        listed = {s.value for s in entry.severities} if entry else set()
        if entry is None:
            wrong.append(f"{code} is not in drill.catalogue.CODES")
        elif severities - listed:
            wrong.append(
                f"{code} was made at {', '.join(sorted(severities - listed))}, which drill.catalogue does not list"
            )
    if wrong:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("finding codes outside the catalogue: " + "; ".join(wrong), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
