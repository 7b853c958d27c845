"""One policy drill in its own child process, with a wall-clock timeout and a memory limit.

A crash, an OOM kill or a hang in a restore cannot take the caller (the scheduler, or the
``drill run --policy`` a crontab started) down with it; the caller records what happened —
exit code or signal, last phase reached — so no drill is ever missing from the record.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from drill.alerts import Delivery, send_alerts
from drill.policy.model import Policy
from drill.records.store import Records
from drill.scheduling.proc import child_preexec

@dataclass(slots=True)
class IsolatedResult:
    drill_id: int | None
    status: str
    exit_code: int
    message: str | None
    document: dict[str, Any] | None = None
    deliveries: list[Delivery] = field(default_factory=list)


# Children of this process, so a graceful stop can ask them to wrap up (see scheduler).
RUNNING: dict[int, subprocess.Popen] = {}
_LOCK = threading.Lock()


def describe_exit(code: int, timed_out: float | None) -> str:
    if timed_out is not None:
        return f"killed at the policy's {timed_out:g} s timeout"
    if code < 0:
        sig = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        why = " (the OOM killer's signal, or an operator's)" if -code == signal.SIGKILL else ""
        return f"killed by {sig}{why}"
    return f"exited with code {code} without a verdict"


def run_isolated(policy: Policy, db_url: str, records: Records, *, trigger: str) -> IsolatedResult:
    """Run ``policy``'s drill in a child ``drill run --policy … --in-child`` and record it."""
    env = {**os.environ, "DRILL_DATABASE_URL": db_url, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    cmd = [sys.executable, "-m", "drill", "run", "--policy", policy.path, "--in-child", "--trigger", trigger, "--json"]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=_stderr(),
        env=env,
        preexec_fn=child_preexec(policy.limits.memory),  # noqa: PLW1509 - no threads touched before exec
        text=True,
    )
    with _LOCK:
        RUNNING[proc.pid] = proc
    timed_out = None
    try:
        out, _ = proc.communicate(timeout=policy.limits.timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        timed_out = policy.limits.timeout
    finally:
        with _LOCK:
            RUNNING.pop(proc.pid, None)
    doc = _document(out)
    if doc is not None and timed_out is None:
        result = IsolatedResult(doc["drill_id"], doc["status"], proc.returncode, doc.get("message"), doc)
    else:
        reason = describe_exit(proc.returncode, timed_out)
        if policy.limits.memory and proc.returncode != 0 and timed_out is None:
            reason += f"; its memory limit was {policy.limits.memory} bytes"
        # Stopped on purpose (SIGINT/SIGTERM: a scheduler shutting down) is `aborted`; a crash,
        # an OOM kill or a timeout is an `error` of the drill.
        stopped = timed_out is None and proc.returncode in (130, -signal.SIGTERM, -signal.SIGINT)
        status = "aborted" if stopped else "error"
        drill_id = records.running_drill_of(proc.pid)
        if drill_id is not None:
            records.close_dead_drill(drill_id, status=status, reason=f"the drill process {reason}")
        else:
            drill_id = records.record_lost_drill(
                run_root=policy.checkpoints.root,
                trigger=trigger,
                policy=policy.name,
                reason=f"the drill process {reason} before recording",
                status=status,
            )
        result = IsolatedResult(drill_id, records.get(drill_id)["status"], proc.returncode, f"the drill process {reason}")
    if result.drill_id is not None:
        drill = {**records.get(result.drill_id), "message": result.message}
        result.deliveries = send_alerts(policy.alerts, drill, policy.name)
        if result.deliveries:
            records.record_alerts(result.drill_id, result.deliveries)
    return result


def _document(out: str | None) -> dict[str, Any] | None:
    if not out:
        return None
    try:
        doc = json.loads(out)
    except json.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) and "drill_id" in doc else None


def _stderr() -> int | None:
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return subprocess.DEVNULL


def stop_children(grace: float) -> None:
    """Ask running drills to stop (SIGTERM: each records itself ``aborted``), then kill."""
    with _LOCK:
        procs = list(RUNNING.values())
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            p.kill()
