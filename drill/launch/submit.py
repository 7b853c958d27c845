"""``drill submit``: a policy's drill as a batch job, followed to its end, always recorded.

Slurm: the job is submitted and followed; rank 0 inside it records the drill with the job's
id. Whatever happens to the job — refused at submission (a bad partition), cancelled after
waiting too long in the queue, killed at its time limit, its node lost — the drill is on the
record: the one the job wrote, closed as an ``error`` if the job died under it, or a new one
saying why no drill ran. Kubernetes: with a cluster configured, the Job is applied through
the API and followed the same way (:mod:`~drill.launch.k8s_api`); without one — or for a
CronJob — the manifests are rendered for an admin to apply.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from drill.errors import ExitCode, UsageError
from drill.launch import slurm
from drill.launch.jobs import Interrupted, JobEnd
from drill.pipeline.outcome import DrillOutcome
from drill.pipeline.recorder import DrillStart
from drill.policy.model import Policy
from drill.storage.local import read_regular
from drill.verdict import DrillStatus, exit_code_for


@dataclass(slots=True)
class Submission:
    launcher: str
    text: str
    """The batch script or the manifests."""
    job_id: str | None = None
    end: JobEnd | None = None
    outcome: DrillOutcome | None = None
    output: str | None = None
    """Where the job's output is: Slurm's output file, or the ``kubectl logs`` command."""


def job_db_url(db: str | None) -> str | None:
    """The ``--db`` to put in a job script: the URL, unless it holds a password — then the job
    takes ``$DRILL_DATABASE_URL`` from the submitting environment and the script names none."""
    import os

    from sqlalchemy.engine import make_url

    from drill.records.db import DATABASE_ENV, resolve_url

    url = resolve_url(db)
    if make_url(url).password is None:
        return url
    if db is not None and os.environ.get(DATABASE_ENV) != db:
        raise UsageError(
            f"--db holds a password, which a job script must not: export {DATABASE_ENV} instead (the job inherits it)"
        )
    return None


def submit_slurm(
    policy: Policy,
    *,
    db: str | None,
    dry_run: bool = False,
    env: dict[str, str] | None = None,
    trigger: str = "policy",
    on_state: Any = None,
    stop: Any = None,
) -> Submission:
    """Submit the policy's drill, follow the job to its end and make sure it is recorded once.
    Interrupted (Ctrl-C, SIGTERM) while following: the job is cancelled, recorded ``aborted``,
    and :class:`~drill.launch.jobs.Interrupted` carries the submission out."""
    nonce = slurm.new_nonce()
    script = slurm.render(policy, db_url=job_db_url(db), trigger=trigger, nonce=nonce)
    sub = Submission("slurm", script)
    if dry_run:
        return sub
    from drill.records.db import open_database
    from drill.records.store import Records

    database = open_database(db)
    try:
        records = Records(database)
        try:
            sub.job_id = slurm.submit(script, env)
        except slurm.SubmitError as exc:
            sub.outcome = records.get(
                records.record_lost(
                    _start(policy, trigger, None),
                    status=DrillStatus.ERROR,
                    exit_code=int(ExitCode.ERROR),
                    reason=str(exc),
                )
            )
            return sub
        sub.output = slurm.output_path(policy, sub.job_id)
        _follow(
            sub,
            records,
            policy,
            trigger,
            f"slurm:{sub.job_id}#{nonce}",
            slurm.SlurmJob(sub.job_id, env),
            on_state=on_state,
            stop=stop,
        )
    finally:
        database.close()
    return sub


def submit_k8s(
    policy: Policy, api: Any, *, db: str | None, trigger: str = "policy", on_state: Any = None, stop: Any = None
) -> Submission:
    """Apply the policy's Job to the configured cluster and follow it like a Slurm job; the pods
    record the drill as ``k8s:<job name>`` (a name of this run only)."""
    from drill.launch import k8s
    from drill.launch.k8s_api import KubeJob, apply, refusal
    from drill.records.db import open_database
    from drill.records.store import Records

    docs = k8s.manifests(policy)
    name, namespace = docs[2]["metadata"]["name"], policy.allocation.namespace or "default"
    sub = Submission("k8s", k8s.render_docs(docs), job_id=name, output=f"kubectl logs -n {namespace} job/{name}")
    database = open_database(db)
    try:
        records = Records(database)
        try:
            apply(api, docs, namespace)
        except Exception as exc:  # noqa: BLE001 - the API refused (RBAC, quota, validation): the drill is still on the record
            reason = f"kubernetes refused the Job: {refusal(exc)}"
            sub.outcome = records.get(
                records.record_lost(
                    _start(policy, trigger, None),
                    status=DrillStatus.ERROR,
                    exit_code=int(ExitCode.ERROR),
                    reason=reason,
                )
            )
            return sub
        _follow(
            sub, records, policy, trigger, f"k8s:{name}", KubeJob(api, name, namespace), on_state=on_state, stop=stop
        )
    finally:
        database.close()
    return sub


def _follow(
    sub: Submission, records: Any, policy: Policy, trigger: str, record_job: str, job: Any, *, on_state: Any, stop: Any
) -> None:
    """Follow the job to its end and reconcile its record; interrupted, the same, then re-raised."""
    from drill.launch.jobs import follow

    if on_state is not None:
        on_state("SUBMITTED", job.job_id)
    try:
        sub.end = follow(job, queue_timeout=policy.allocation.queue_timeout, on_state=on_state, stop=stop)
    except Interrupted as stopped:
        sub.end = stopped.end
        sub.outcome = reconcile(records, policy, trigger, sub.end, record_job, sub.output)
        stopped.submission = sub
        raise
    sub.outcome = reconcile(records, policy, trigger, sub.end, record_job, sub.output)


def _start(policy: Policy, trigger: str, job_id: str | None) -> DrillStart:
    return DrillStart(
        run_root=policy.checkpoints.root, selector=str(policy.selection), trigger=trigger, device=policy.device, policy=policy.name,
        started_at=datetime.now(timezone.utc), versions=_versions(), job_id=job_id,
    )  # fmt: skip


def _versions() -> dict[str, str | None]:
    """drill's and torch's versions on this host (the job's are the same install, or the record
    it wrote says otherwise)."""
    from importlib.metadata import PackageNotFoundError, version

    from drill import __version__

    try:
        torch = version("torch")
    except PackageNotFoundError:
        torch = None
    return {"drill": __version__, "torch": torch}


def reconcile(records: Any, policy: Policy, trigger: str, end: JobEnd, job: str, output: str | None) -> DrillOutcome:
    """The drill the job recorded (as ``job``) — closed as an error (or ``aborted``, when drill
    cancelled the job) if the job died under it — or, when the job never got as far as
    recording one, a record saying why, on the job's node, with its output and the cause it printed."""
    drill_id = records.by_job(job)
    status, code, why = _how_it_ended(end)
    shown = (
        output if output and (end.was_running or os.path.exists(output)) else None
    )  # a job that never ran wrote none
    if drill_id is None:
        cause = last_words(shown) if shown else None
        reason = (
            f"{why}{' before the drill recorded anything' if end.was_running else ''}"
            + (f": {cause}" if cause else "")
            + (f" (job output: {shown})" if shown else "")
        )
        drill_id = records.record_lost(
            _start(policy, trigger, job), status=status, exit_code=int(code), reason=reason, host=end.host
        )
    else:
        records.close_dead_drill(
            drill_id, status=status, exit_code=int(code), reason=f"{why} (job output: {shown})" if shown else why
        )  # no-op when the drill closed itself
    return records.get(drill_id)


def _how_it_ended(end: JobEnd) -> tuple[DrillStatus, ExitCode, str]:
    """The verdict a job's end gives a drill that did not record its own: ``aborted`` when it was
    cancelled — by drill (an interrupt, a scheduler stopping) or by someone else (``scancel``,
    an administrator), named — else ``error`` with the batch system's final state."""
    was = "running" if end.was_running else "pending"
    if end.cancelled_by is not None:
        code = exit_code_for(DrillStatus.ABORTED, signum=end.cancelled_on)
        return DrillStatus.ABORTED, code, f"{end.cancelled_by}: {end.name} was cancelled while {was}"
    if end.state == "CANCELLED":
        who = (
            end.reason
            if end.reason.startswith("cancelled by")
            else "cancelled by scancel: an operator, an administrator or Slurm"
        )
        return DrillStatus.ABORTED, ExitCode.TERMINATED, f"{end.name} was cancelled while {was}, not by drill ({who})"
    if end.state in ("QUEUE_TIMEOUT", "NEVER_RUNS"):
        return DrillStatus.ERROR, ExitCode.ERROR, f"{end.name} was cancelled: {end.reason}"
    why = f"{end.name} ended {end.state}" + (f" ({end.reason})" if end.reason and end.reason != "None" else "")
    return DrillStatus.ERROR, ExitCode.ERROR, why


OUTPUT_TAIL = 20_000
"""Bytes read from the end of a job's output for its last words: a job that logged for hours
leaves gigabytes, of which only the end is read."""


def last_words(path: str) -> str | None:
    """The last thing the job said: its last ``drill:`` line, else its last line (when this
    host can read the output file: a regular file, of which only the end is read)."""
    try:
        text = read_regular(path, OUTPUT_TAIL, tail=True).decode("utf-8", errors="replace")
    except OSError:
        return None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    picked = [ln for ln in lines if ln.startswith(("drill:", "srun: error", "slurmstepd: error"))] or lines
    return picked[-1][:300] if picked else None


def render_k8s(policy: Policy, *, cron: bool = False) -> Submission:
    """Manifests only — a Job, or with ``cron`` a CronJob on the policy's schedule: the pods read
    the database URL from a Secret, and no cluster is contacted."""
    from drill.launch.k8s import render

    return Submission("k8s", render(policy, cron=cron))


__all__ = ["Submission", "job_db_url", "last_words", "reconcile", "render_k8s", "submit_k8s", "submit_slurm"]
