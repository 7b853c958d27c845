"""One policy drill in its own child process, with a wall-clock timeout and a memory limit.

A crash, an OOM kill or a hang in a restore cannot take the caller (the scheduler, or the
``drill run --policy`` a crontab started) down with it. The child runs the pipeline with the
policy it is handed and sends its drill id as soon as the record exists, then the outcome.
If it dies first, the caller closes that very record with how it died — or, if no record
existed yet, writes one — so every policy drill is on the record exactly once.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, Pipe
from typing import Any

from drill.alerts import Delivery, send_alerts
from drill.errors import DrillError, ExitCode
from drill.pipeline.recorder import DrillStart
from drill.policy.model import Policy
from drill.proc import child_preexec, message_by, python_command
from drill.records.store import Records
from drill.units import human_bytes
from drill.verdict import DrillStatus, exit_code_for


@dataclass(slots=True)
class IsolatedResult:
    drill_id: int | None
    status: DrillStatus | None
    """None when the child refused to start (a usage problem): nothing was recorded."""
    exit_code: int
    message: str | None
    document: dict[str, Any] | None = None
    deliveries: list[Delivery] = field(default_factory=list)
    record_problem: str | None = None


# Children of this process, so a graceful stop can ask them to wrap up (see scheduler).
RUNNING: dict[int, subprocess.Popen] = {}
_LOCK = threading.Lock()


def describe_exit(code: int | None, timed_out: float | None) -> str:
    if timed_out is not None:
        return f"was killed at the policy's {timed_out:g} s timeout"
    if code is not None and code < 0:
        sig = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        why = " (the OOM killer's signal, or an operator's)" if -code == signal.SIGKILL else ""
        return f"was killed by {sig}{why}"
    return f"exited with code {code} without a verdict"


@dataclass(slots=True)
class _Heard:
    drill_id: int | None = None
    outcome: dict[str, Any] | None = None
    record_problem: str | None = None
    refused: tuple[int, str] | None = None
    timed_out: float | None = None


def run_isolated(policy: Policy, db_url: str, records: Records, *, trigger: str) -> IsolatedResult:
    """Run ``policy``'s drill in a child process, make sure it is recorded once, alert."""
    ours, theirs = Pipe(duplex=True)
    proc = subprocess.Popen(
        python_command("drill.scheduling.child", str(theirs.fileno()), untrusted=(policy.checkpoints.root,)),
        pass_fds=(theirs.fileno(),),
        stdin=subprocess.DEVNULL,
        preexec_fn=child_preexec(policy.limits.memory),
    )
    theirs.close()
    with _LOCK:
        RUNNING[proc.pid] = proc
    try:
        heard = _listen(ours, proc, policy, db_url, trigger)
    finally:
        with _LOCK:
            RUNNING.pop(proc.pid, None)
        ours.close()
    if heard.refused is not None:
        return IsolatedResult(None, None, heard.refused[0], heard.refused[1])
    result = _account(heard, proc, policy, records, trigger)
    return _alert(result, policy, records)


def _listen(conn: Connection, proc: subprocess.Popen, policy: Policy, db_url: str, trigger: str) -> _Heard:
    heard = _Heard()
    deadline = time.monotonic() + policy.limits.timeout
    try:
        conn.send((policy, db_url, trigger))
        while heard.outcome is None and heard.refused is None:
            if not message_by(conn, deadline):
                heard.timed_out = policy.limits.timeout
                proc.kill()
                break
            msg = conn.recv()
            if msg[0] == "begun":
                heard.drill_id = msg[1]
            elif msg[0] == "outcome":
                heard.outcome, heard.record_problem = msg[1], msg[2]
            elif msg[0] == "refused":
                heard.refused = (msg[1], msg[2])
    except (EOFError, OSError):
        pass  # the child died: _account says how
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return heard


def _account(heard: _Heard, proc: subprocess.Popen, policy: Policy, records: Records, trigger: str) -> IsolatedResult:
    """The child's own verdict, or — if it died without one — the record of how it died."""
    if heard.outcome is not None and heard.timed_out is None:
        doc = heard.outcome
        return IsolatedResult(
            doc["id"],
            DrillStatus(doc["status"]),
            int(doc["exit_code"]),
            doc.get("message"),
            doc,
            record_problem=heard.record_problem,
        )
    reason = f"the drill process {describe_exit(proc.returncode, heard.timed_out)}"
    if policy.limits.memory and heard.timed_out is None and proc.returncode != 0:
        reason += f"; its memory limit was {human_bytes(policy.limits.memory)}"
    # Stopped on purpose (SIGINT/SIGTERM: a scheduler shutting down) is `aborted`; a crash, an
    # OOM kill or a timeout is an `error` of the drill.
    stopped = heard.timed_out is None and proc.returncode in (130, 143, -signal.SIGTERM, -signal.SIGINT)
    status = DrillStatus.ABORTED if stopped else DrillStatus.ERROR
    code = exit_code_for(status, signum=signal.SIGTERM if proc.returncode in (143, -signal.SIGTERM) else None)
    drill_id = heard.drill_id
    if drill_id is not None:
        records.close_dead_drill(drill_id, status=status, exit_code=int(code), reason=reason)
    else:
        drill_id = _record_lost(records, policy, trigger, status, code, f"{reason} before it could record anything")
    outcome = records.get(drill_id)
    return IsolatedResult(drill_id, outcome.status, int(outcome.exit_code), outcome.message, outcome.to_document())


def _record_lost(
    records: Records, policy: Policy, trigger: str, status: DrillStatus, code: ExitCode, reason: str
) -> int:
    """A drill whose process died before it wrote a row: it still goes on the record."""
    from datetime import datetime, timezone

    start = DrillStart(
        run_root=policy.checkpoints.root, selector=str(policy.selection), trigger=trigger, device=policy.device,
        policy=policy.name, started_at=datetime.now(timezone.utc), versions={"drill": None, "torch": None},
    )  # fmt: skip
    return records.record_lost(start, status=status, exit_code=int(code), reason=reason)


def _alert(result: IsolatedResult, policy: Policy, records: Records) -> IsolatedResult:
    if result.drill_id is None or result.document is None:
        return result
    try:
        result.deliveries = send_alerts(policy.alerts, result.document, policy.name)
    except Exception as exc:  # noqa: BLE001 - an alert never changes, or loses, the verdict
        result.deliveries = [Delivery("alerts", "-", False, 0, f"{type(exc).__name__}: alerts could not be sent")]
    if result.deliveries:
        try:
            records.record_alerts(result.drill_id, result.deliveries)
            result.document = records.get(result.drill_id).to_document()
        except DrillError as exc:
            result.record_problem = f"the alert deliveries could not be recorded ({exc.message})"
    return result


def stop_children(grace: float) -> None:
    """Ask running drills to stop (SIGTERM: each records itself ``aborted``), then kill; batch
    jobs still followed are cancelled (see :func:`run_submitted`)."""
    _STOP_JOBS.set()
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


_STOP_JOBS = threading.Event()
"""Set when the scheduler's grace is over: the batch jobs it follows are cancelled."""


def follow_jobs() -> None:
    """A scheduler starting: batch jobs are followed until :func:`stop_children`."""
    _STOP_JOBS.clear()


def run_submitted(
    policy: Policy, db_url: str, records: Records, *, trigger: str, stopping: threading.Event | None = None
) -> IsolatedResult:
    """A policy whose allocation says ``launcher: slurm`` or ``k8s``: its drill runs as a batch
    job (a Kubernetes Job on the configured cluster), followed to its end (see :mod:`drill.launch.submit`); alerts as for a local drill. When the
    scheduler stops, a job still pending is cancelled at once and recorded ``aborted``; a
    running one gets the grace time, then is cancelled (its ranks record themselves aborted)."""
    from drill.launch.submit import submit_k8s, submit_slurm

    def stop(state: str) -> str | None:
        if stopping is not None and stopping.is_set() and state == "PENDING":
            return "the scheduler stopped (SIGTERM) before the job started"
        return "the scheduler stopped (SIGTERM) and its grace time ran out" if _STOP_JOBS.is_set() else None

    if policy.allocation.launcher == "k8s":
        from drill.launch.k8s_api import configured_api

        api = configured_api()
        if api is None:
            raise DrillError(f"policy {policy.name}: no Kubernetes cluster is configured to run its Job")
        sub = submit_k8s(policy, api, db=db_url, trigger=trigger, stop=stop)
    else:
        sub = submit_slurm(policy, db=db_url, trigger=trigger, stop=stop)
    o = sub.outcome
    assert o is not None
    return _alert(IsolatedResult(o.id, o.status, int(o.exit_code), o.message, o.to_document()), policy, records)


def run_policy_drill(
    policy: Policy, db_url: str, records: Records, *, trigger: str, stopping: threading.Event | None = None
) -> IsolatedResult:
    """The policy's drill where its allocation says: an isolated child here, or a Slurm job."""
    if policy.allocation.launcher in ("slurm", "k8s"):
        return run_submitted(policy, db_url, records, trigger=trigger, stopping=stopping)
    return run_isolated(policy, db_url, records, trigger=trigger)
