"""Nightly drills for real: isolated policy drills, and the scheduler daemon in a subprocess."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from drill import get_drill, history
from drill.policy import load_policy
from drill.records.db import open_database
from drill.records.store import Records
from drill.scheduling.isolate import run_isolated
from tests.conftest import invoke

pytestmark = pytest.mark.slow


def _policy(tmp: Path, name: str, root: Path, body: str = "") -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(f"name: {name}\ncheckpoints: {{root: {root}}}\nselection: {{strategy: latest}}\n{body}")
    return path


def _wait(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _drills(db: str, policy: str | None = None) -> list[dict]:
    """Recorded drills, oldest first, as ``drill history --json`` prints them."""
    return [d.to_document(with_checks=False) for d in history(db=db, limit=500, policy=policy)][::-1]


def _start(db: str, *policies: Path, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "drill",
            "scheduler",
            "start",
            *map(str, policies),
            "--db",
            db,
            "--heartbeat",
            "0.5",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _example_demo_policy(demo_run: Path) -> Path:
    """policies/demo.yaml itself, beside a demo run, with only its schedule made short."""
    text = (Path(__file__).resolve().parent.parent / "policies" / "demo.yaml").read_text()
    assert 'cron: "0 3 * * *"' in text and "settle: 10s" in text
    text = text.replace('cron: "0 3 * * *"', 'cron: "*/2 * * * * *"').replace("settle: 10s", "settle: 0s")
    demo_run.rename(demo_run.parent / "demo-run")
    path = demo_run.parent / "policies" / "demo.yaml"
    path.parent.mkdir()
    path.write_text(text)
    return path


# Three drills with a replay each take ~15 s on an idle machine and several times that on a
# loaded one: the waits are on events (the records), their deadlines only a safety net.
LOADED = 4


@pytest.mark.timeout(300 * LOADED)
def test_scheduler_fires_records_never_overlaps_survives_a_crash(
    demo_run: Path, tmp_path: Path, sqlite_url: str
) -> None:
    good = _example_demo_policy(demo_run)
    demo_run = demo_run.parent / "demo-run"
    crashy = _policy(
        tmp_path, "crashy", demo_run, "schedule: {cron: '*/3 * * * * *', start_window: 5s}\nlimits: {memory: 64MiB}\n"
    )
    proc = _start(sqlite_url, good, crashy, extra=("--concurrency", "2"))
    try:
        _wait(
            lambda: len([d for d in _drills(sqlite_url, "demo-nightly") if d["status"] == "passed"]) >= 3,
            90 * LOADED,
            "three passed drills",
        )
        _wait(
            lambda: any(d["status"] == "error" for d in _drills(sqlite_url, "crashy")),
            30 * LOADED,
            "the crashing drill",
        )
        status = invoke(CliRunner(), "scheduler", "status", "--json", "--db", sqlite_url)
        assert status.exit_code == 0
        state = json.loads(status.stdout)
        assert state["alive"] and set(state["policies"]) == {"demo-nightly", "crashy"}
        demo = state["policies"]["demo-nightly"]
        assert demo["next_fire"] and demo["last"]["status"] in ("passed", "running") and demo["counts"]["passed"] >= 3
        table = invoke(CliRunner(), "scheduler", "status", "--db", sqlite_url).stdout
        assert "ALIVE" in table and "demo-nightly" in table and "crashy" in table
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    runs = [d for d in _drills(sqlite_url, "demo-nightly") if d["status"] != "running"]
    assert all(d["trigger"] == "scheduler" for d in runs)
    assert {d["replay"]["verdict"] for d in runs if d["status"] == "passed"} == {"passed"}  # replayed bit for bit
    for before, after in itertools.pairwise(runs):  # one policy never has two drills at once
        assert after["started_at"] >= before["finished_at"]
    crashed = next(d for d in _drills(sqlite_url, "crashy") if d["status"] == "error")
    assert "memory limit was 67.1 MB" in crashed["message"]
    assert invoke(CliRunner(), "scheduler", "status", "--db", sqlite_url).exit_code == 3  # stopped: not alive


def test_two_schedulers_on_one_database(demo_run: Path, tmp_path: Path, db_url: str) -> None:
    sqlite_url = db_url  # on the embedded SQLite and on the live PostgreSQL
    policy = _policy(tmp_path, "p", demo_run, "schedule: {cron: '0 3 * * *'}\n")
    first = _start(sqlite_url, policy)
    try:
        _wait(
            lambda: json.loads(invoke(CliRunner(), "scheduler", "status", "--json", "--db", sqlite_url).stdout)[
                "alive"
            ],
            30,
            "the first scheduler",
        )
        second = subprocess.run(
            [sys.executable, "-m", "drill", "scheduler", "start", str(policy), "--db", sqlite_url],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 7
        assert "another scheduler holds this database's lease" in second.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    assert first.returncode == 0


def test_scheduler_killed_mid_drill_leaves_the_drill_aborted_after_restart(
    demo_run: Path, tmp_path: Path, sqlite_url: str
) -> None:
    policy = _policy(
        tmp_path,
        "hangs",
        demo_run,
        "schedule: {cron: '*/2 * * * * *'}\nreplay: {entrypoint: 'tests.support.replay_targets:hanging', timeout: 10m}\nlimits: {timeout: 20m}\n",
    )
    proc = _start(sqlite_url, policy)
    drill = _wait(
        lambda: next((d for d in _drills(sqlite_url) if d["status"] == "running" and d["phase"] == "replay"), None),
        60,
        "a drill in its replay",
    )
    proc.kill()  # SIGKILL: no chance to clean up
    proc.communicate(timeout=30)
    _wait(lambda: not _alive(drill["pid"]), 15, "the drill's process to die with its scheduler")
    assert next(d for d in _drills(sqlite_url) if d["id"] == drill["id"])["status"] == "running"
    _wait(
        lambda: invoke(CliRunner(), "scheduler", "status", "--db", sqlite_url).exit_code == 3,
        30,
        "the dead scheduler's lease to lapse",
    )

    again = _start(sqlite_url, policy, extra=("--grace", "1"))
    try:
        after = _wait(
            lambda: next((d for d in _drills(sqlite_url) if d["id"] == drill["id"] and d["status"] == "aborted"), None),
            30,
            "recovery",
        )
        assert (
            "is gone and never closed this record" in after["message"]
            and "(last phase reached: replay)" in after["message"]
        )
    finally:
        again.send_signal(signal.SIGTERM)
        again.communicate(timeout=60)
    assert all(d["status"] != "running" for d in _drills(sqlite_url))  # the stopped one recorded itself too


def test_oom_killed_drill_child_is_recorded(demo_run: Path, tmp_path: Path, sqlite_url: str) -> None:
    policy = load_policy(
        _policy(
            tmp_path, "oom", demo_run, "replay: {entrypoint: 'tests.support.replay_targets:hanging', timeout: 10m}\n"
        )
    )
    db = open_database(sqlite_url)
    result: dict[str, Any] = {}
    worker = threading.Thread(
        target=lambda: result.update(r=run_isolated(policy, sqlite_url, Records(db), trigger="policy"))
    )
    worker.start()
    drill = _wait(
        lambda: next((d for d in _drills(sqlite_url) if d["status"] == "running" and d["phase"] == "replay"), None),
        60,
        "the replay",
    )
    os.kill(drill["pid"], signal.SIGKILL)  # what the kernel's OOM killer does
    worker.join(60)
    r = result["r"]
    assert r.status == "error" and "killed by SIGKILL" in r.message
    record = get_drill(drill["id"], db=sqlite_url)
    assert record.status == "error" and "last phase reached: replay" in record.message
    db.close()


def test_drill_timeout_kills_the_child(demo_run: Path, tmp_path: Path, sqlite_url: str) -> None:
    policy = load_policy(
        _policy(
            tmp_path,
            "slow",
            demo_run,
            "replay: {entrypoint: 'tests.support.replay_targets:hanging', timeout: 10m}\nlimits: {timeout: 12s}\n",
        )
    )
    db = open_database(sqlite_url)
    r = run_isolated(policy, sqlite_url, Records(db), trigger="policy")
    # The child stops itself a little before the policy's timeout, to record the phase it was
    # in; on a loaded machine the parent's kill at the timeout itself may come first.
    assert r.status == "error" and r.exit_code == 5
    assert (
        "ran past its 10.8 s timeout during replay" in r.message or "killed at the policy's 12 s timeout" in r.message
    ), r.message
    assert get_drill(r.drill_id, db=sqlite_url).status == "error"
    from drill.api import verify_audit_chain

    chain = verify_audit_chain(db=sqlite_url)  # closed by whichever side, the record is sealed
    assert chain.intact and chain.head is not None and chain.head.drill_id == r.drill_id and chain.records == 1
    db.close()


def test_run_policy_from_crontab(demo_run: Path, tmp_path: Path, sqlite_url: str) -> None:
    ok = _policy(tmp_path, "ok", demo_run, "replay: {enabled: false}\n")
    res = subprocess.run(
        [sys.executable, "-m", "drill", "run", "--policy", str(ok), "--db", sqlite_url], capture_output=True, text=True
    )
    assert res.returncode == 0 and res.stdout == "" and res.stderr == ""  # quiet for cron

    slow = _policy(tmp_path, "slo", demo_run, "replay: {enabled: false}\nslo: {max_restore_seconds: 0.000001}\n")
    res = subprocess.run(
        [sys.executable, "-m", "drill", "run", "--policy", str(slow), "--json", "--db", sqlite_url],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 6
    doc = json.loads(res.stdout)
    assert doc["status"] == "slo_breach" and "over the 1e-06 s target" in doc["message"] and doc["policy"] == "slo"
    shown = get_drill(doc["id"], db=sqlite_url).to_document()
    assert shown.pop("seal")["state"] == "intact" and doc == shown  # the drill's one document
    assert "drill: slo_breach: drill #" in res.stderr

    gone = _policy(tmp_path, "gone", tmp_path / "absent", "replay: {enabled: false}\n")
    res = subprocess.run(
        [sys.executable, "-m", "drill", "run", "--policy", str(gone), "--db", sqlite_url],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 3 and "does not exist" in res.stderr
    statuses = [d["status"] for d in _drills(sqlite_url)]
    assert statuses == ["passed", "slo_breach"]  # a root that is not there is no audit record
    db = open_database(sqlite_url)
    counts = Records(db).policy_summary("slo")["counts"]
    db.close()
    assert counts == {"slo_breach": 1}  # counted apart from integrity failures


def test_run_policy_rejects_bad_input(tmp_path: Path, sqlite_url: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ncheckpoints: {root: /r, keep_lst: 2}\n")
    res = invoke(CliRunner(), "run", "--policy", str(bad), "--db", sqlite_url)
    assert res.exit_code == 2 and "invalid policy" in res.stderr and "keep_lst" in res.stderr
    res = invoke(CliRunner(), "run", "--policy", str(bad), "--root", "/r", "--db", sqlite_url)
    assert res.exit_code == 2
    assert _drills(sqlite_url) == []


def test_last_good(demo_run: Path, tmp_path: Path, sqlite_url: str) -> None:
    runner = CliRunner()
    none = invoke(runner, "last-good", "--root", str(demo_run), "--db", sqlite_url)
    assert none.exit_code == 3 and "no retained checkpoint" in none.stderr
    assert (
        invoke(runner, "run", "--root", str(demo_run), "-c", "step:20", "--no-replay", "--db", sqlite_url).exit_code
        == 0
    )
    os.remove(demo_run / "step-30" / "__0_0.distcp")
    assert (
        invoke(runner, "run", "--root", str(demo_run), "-c", "step:30", "--no-replay", "--db", sqlite_url).exit_code
        == 1
    )
    good = invoke(runner, "last-good", "--root", str(demo_run), "--db", sqlite_url)
    assert good.exit_code == 0 and good.stdout == f"{demo_run / 'step-20'}\n"
    doc = json.loads(invoke(runner, "last-good", "--root", str(demo_run), "--json", "--db", sqlite_url).stdout)
    assert doc["checkpoint"]["step"] == 20


def test_a_scheduler_stopped_mid_drill_records_that_drill_once_and_starts_no_other(
    demo_run: Path, tmp_path: Path, sqlite_url: str
) -> None:
    hook = tmp_path / "alerts.jsonl"
    policy = _policy(
        tmp_path,
        "hangs",
        demo_run,
        "schedule: {cron: '*/2 * * * * *'}\nreplay: {entrypoint: 'tests.support.replay_targets:hanging', timeout: 10m}\n"
        f"limits: {{timeout: 20m}}\nalerts: {{command: 'cat >> {hook}', on: [aborted]}}\n",
    )
    proc = _start(sqlite_url, policy, extra=("--grace", "1"))
    drill = _wait(
        lambda: next((d for d in _drills(sqlite_url) if d["status"] == "running" and d["phase"] == "replay"), None),
        60,
        "a drill in its replay",
    )
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    time.sleep(2.5)  # a cron tick after the stop fires nothing
    ((drill_id, status, phase),) = [(d["id"], d["status"], d["phase"]) for d in _drills(sqlite_url)]
    assert (drill_id, status, phase) == (drill["id"], "aborted", "replay")
    (alert,) = [json.loads(line) for line in hook.read_text().splitlines()]
    assert alert["drill_id"] == drill_id and alert["status"] == "aborted"  # the drill that was stopped, alerted once


def test_a_scheduled_drill_that_does_not_run_is_on_the_record_and_counted(
    demo_run: Path, tmp_path: Path, sqlite_url: str
) -> None:
    """A policy whose run root is gone is refused before a drill record is opened — and the
    scheduler records that (and a missed fire time) as events the metrics count."""
    from datetime import datetime, timezone
    from types import SimpleNamespace

    from apscheduler.events import EVENT_JOB_MISSED

    from drill.scheduling import scheduler as sched

    gone = load_policy(
        _policy(tmp_path, "gone", tmp_path / "absent", "schedule: {cron: '0 3 * * *'}\nreplay: {enabled: false}\n")
    )
    db = open_database(sqlite_url)
    try:
        assert Records(db).acquire_lease("tester", 60, ["gone"]) is None
        sched._CONTEXT.db_url, sched._CONTEXT.holder, sched._CONTEXT.policies = sqlite_url, "tester", {"gone": gone}
        sched._CONTEXT.stopping.clear()
        sched.fire("gone")
        sched._on_job_event(
            SimpleNamespace(
                code=EVENT_JOB_MISSED, job_id="gone", scheduled_run_time=datetime(2026, 12, 1, 3, tzinfo=timezone.utc)
            )
        )
        events = Records(db).scheduler_events(policy="gone")
    finally:
        sched._CONTEXT.policies = {}
        db.close()
    assert [(e["kind"], e["exit_code"]) for e in events] == [("missed", None), ("refused", 3)]
    assert "does not exist" in events[1]["reason"] and history(db=sqlite_url) == []
    prom = tmp_path / "drill.prom"
    invoke(CliRunner(), "metrics", "--textfile", str(prom), "--db", sqlite_url)
    text = prom.read_text()
    assert 'drill_scheduler_events_total{kind="refused",policy="gone"} 1.0' in text and "drill_scheduler_up 1.0" in text


@pytest.mark.parametrize(
    "option", [["--no-replay"], ["--root", "/r"], ["-c", "step:3"], ["--device", "cpu"], ["--timeout", "60"]]
)
def test_an_option_the_policy_owns_given_beside_it_is_refused_not_ignored(
    tmp_path: Path, sqlite_url: str, option: list[str]
) -> None:
    """``drill run --policy P --no-replay`` replayed anyway (every option but --root and
    --checkpoint was silently dropped): each one the policy owns is a usage error naming it."""
    policy = _policy(tmp_path, "p", tmp_path)
    res = invoke(CliRunner(), "run", "--policy", str(policy), *option, "--db", sqlite_url)
    flag = {"-c": "--checkpoint"}.get(option[0], option[0])
    assert res.exit_code == 2 and f"drop {flag}, or set it in the policy file" in res.stderr, res.stderr
    assert _drills(sqlite_url) == []


def test_a_policy_whose_limits_no_timer_or_cap_can_hold_runs_its_drill(
    demo_run: Path, tmp_path: Path, sqlite_url: str
) -> None:
    """``limits: {timeout: 99999999999999999999d}`` was an ``OverflowError`` in the parent's
    poll and ``memory: 99999999999999999999999TB`` one in the child's ``setrlimit`` (exit 70
    both): a wait that long is bounded polls, a cap past any host's is none."""
    body = "replay: {enabled: false}\nlimits: {timeout: 99999999999999999999d, memory: 99999999999999999999999TB}\n"
    res = subprocess.run(
        [sys.executable, "-m", "drill", "run", "--policy", str(_policy(tmp_path, "huge", demo_run, body)), "--db", sqlite_url],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert res.returncode == 0 and res.stderr == "", res.stderr
    assert [d["status"] for d in _drills(sqlite_url)] == ["passed"]


def test_a_policy_child_whose_parent_is_gone_ends_without_a_traceback() -> None:
    """A policy drill's parent stopped (SIGTERM) left its child printing a BrokenPipeError
    traceback onto the terminal they shared: the child ends quietly."""
    from multiprocessing import Pipe

    ours, theirs = Pipe(duplex=True)
    ours.close()  # the parent, gone before it sent the policy
    res = subprocess.run(
        [sys.executable, "-m", "drill.scheduling.child", str(theirs.fileno())],
        pass_fds=(theirs.fileno(),), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    theirs.close()
    assert res.returncode == 5 and res.stderr == "", res.stderr
