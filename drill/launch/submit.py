"""``drill submit``: a policy's drill as a batch job, followed to its end, always recorded.

Slurm: the job is submitted and followed; rank 0 inside it records the drill with the job's
id. Whatever happens to the job — refused at submission (a bad partition), cancelled after
waiting too long in the queue, killed at its time limit, its node lost — the drill is on the
record: the one the job wrote, closed as an ``error`` if the job died under it, or a new one
saying why no drill ran. Kubernetes: the manifests are rendered for an admin to apply (no
cluster is contacted).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from drill.errors import ExitCode, UsageError
from drill.launch import slurm
from drill.pipeline.outcome import DrillOutcome
from drill.pipeline.recorder import DrillStart
from drill.policy.model import Policy
from drill.verdict import DrillStatus


@dataclass(slots=True)
class Submission:
    launcher: str
    text: str
    """The batch script or the manifests."""
    job_id: str | None = None
    end: slurm.JobEnd | None = None
    outcome: DrillOutcome | None = None


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
        raise UsageError(f"--db holds a password, which a job script must not: export {DATABASE_ENV} instead (the job inherits it)")
    return None


def submit_slurm(policy: Policy, *, db: str | None, dry_run: bool = False, env: dict[str, str] | None = None, trigger: str = "policy", on_state: Any = None) -> Submission:
    script = slurm.render(policy, db_url=job_db_url(db), trigger=trigger)
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
            sub.outcome = records.get(records.record_lost(_start(policy, trigger, None), status=DrillStatus.ERROR, exit_code=int(ExitCode.ERROR), reason=str(exc)))
            return sub
        if on_state is not None:
            on_state("SUBMITTED", sub.job_id)
        sub.end = slurm.wait(sub.job_id, queue_timeout=policy.allocation.queue_timeout, env=env, on_state=on_state)
        sub.outcome = reconcile(records, policy, trigger, sub.end)
    finally:
        database.close()
    return sub


def _start(policy: Policy, trigger: str, job_id: str | None) -> DrillStart:
    return DrillStart(
        run_root=policy.checkpoints.root, selector=str(policy.selection), trigger=trigger, device=policy.device, policy=policy.name,
        started_at=datetime.now(timezone.utc), versions={"drill": None, "torch": None}, job_id=job_id,
    )  # fmt: skip


def reconcile(records: Any, policy: Policy, trigger: str, end: slurm.JobEnd) -> DrillOutcome:
    """The drill the job recorded — closed as an error if the job died under it — or, when the
    job never got as far as recording one, a record saying why."""
    job = f"slurm:{end.job_id}"
    drill_id = records.by_job(job)
    why = f"slurm job {end.job_id} ended {end.state}" + (f" ({end.reason})" if end.reason and end.reason != "None" else "")
    if drill_id is None:
        reason = f"{why} before the drill recorded anything" if end.state != "QUEUE_TIMEOUT" else f"slurm job {end.job_id} was cancelled: {end.reason}"
        drill_id = records.record_lost(_start(policy, trigger, job), status=DrillStatus.ERROR, exit_code=int(ExitCode.ERROR), reason=reason)
    else:
        records.close_dead_drill(drill_id, status=DrillStatus.ERROR, exit_code=int(ExitCode.ERROR), reason=why)  # no-op when the drill closed itself
    return records.get(drill_id)


def render_k8s(policy: Policy) -> Submission:
    """Manifests only: the pods read the database URL from a Secret, and no cluster is contacted."""
    from drill.launch.k8s import render

    return Submission("k8s", render(policy))


__all__ = ["Submission", "job_db_url", "reconcile", "render_k8s", "submit_slurm"]
