"""``drill scheduler start``: APScheduler 3.x firing each policy's drill on its cron schedule.

- One job per policy, persisted in the record database (APScheduler's SQLAlchemy job store).
- At most one running drill per policy (``max_instances=1``) and at most ``concurrency`` in
  all; a run missed by less than the policy's start window still fires, coalesced into one.
- Each drill runs isolated (:mod:`drill.scheduling.isolate`): the scheduler survives a
  crashing, OOM-killed or hanging drill, and records its outcome.
- A lease row in the database makes sure that of two schedulers pointed at the same database
  only one fires jobs; its heartbeat is what ``drill scheduler status`` reads.
- SIGTERM/SIGINT stop it gracefully: no new drills; running ones get ``grace`` seconds to
  finish, then are asked to stop (and record themselves ``aborted``).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from drill.errors import DrillError, ExitCode, UsageError
from drill.policy.model import Policy
from drill.records.db import open_database
from drill.records.store import Records

log = logging.getLogger("drill.scheduler")


class SchedulerLocked(DrillError):
    exit_code = ExitCode.LOCKED


@dataclass(slots=True)
class _Context:
    """What jobs need at fire time; module-level so jobs persist as a plain function + name."""

    db_url: str = ""
    holder: str = ""
    policies: dict[str, Policy] = field(default_factory=dict)
    on_result: Any = None
    stopping: threading.Event = field(default_factory=threading.Event)
    """Set on SIGTERM/SIGINT: a job that fires after it starts no drill."""


_CONTEXT = _Context()


def fire(policy_name: str) -> None:
    """The job APScheduler runs: one drill of the named policy, isolated here or as a batch job.
    A drill that does not run is a scheduler event on the record, never only a log line."""
    from drill.scheduling.isolate import run_policy_drill

    policy = _CONTEXT.policies.get(policy_name)
    if policy is None:
        log.warning("no policy %s loaded; job ignored", policy_name)
        return
    if _CONTEXT.stopping.is_set():
        _event(policy_name, "skipped", "the scheduler was stopping: not started")
        return
    db = open_database(_CONTEXT.db_url)
    try:
        records = Records(db)
        if not records.holds_lease(_CONTEXT.holder):
            log.error("lost the scheduler lease; not firing %s", policy_name)
            records.scheduler_event(
                policy_name, "skipped", "this scheduler lost its lease: not started", holder=_CONTEXT.holder
            )
            return
        result = run_policy_drill(policy, _CONTEXT.db_url, records, trigger="scheduler", stopping=_CONTEXT.stopping)
        log.info(
            "policy %s: drill #%s %s", policy_name, result.drill_id, result.status or f"not started: {result.message}"
        )
        if result.status is None:  # refused before a record was opened (the run gone, the storage refusing)
            records.scheduler_event(
                policy_name, "refused", result.message or "refused", exit_code=result.exit_code, holder=_CONTEXT.holder
            )
        if _CONTEXT.on_result is not None:
            _CONTEXT.on_result(policy_name, result)
    except Exception as exc:
        log.exception("policy %s: the drill could not be run", policy_name)
        _event(policy_name, "error", f"the drill could not be run: {type(exc).__name__}: {exc}")
    finally:
        db.close()


def _event(policy: str, kind: str, reason: str, scheduled_for: Any = None) -> None:
    """Record a scheduler event, best effort (the database may be what failed)."""
    log.warning("policy %s: %s: %s", policy, kind, reason)
    try:
        db = open_database(_CONTEXT.db_url)
        try:
            Records(db).scheduler_event(policy, kind, reason, scheduled_for=scheduled_for, holder=_CONTEXT.holder)
        finally:
            db.close()
    except Exception:
        log.exception("policy %s: the scheduler event could not be recorded", policy)


def _on_job_event(event: Any) -> None:
    """APScheduler's word that a fire time was missed, or that the previous drill was still running."""
    from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED

    when = getattr(event, "scheduled_run_time", None)
    if event.code == EVENT_JOB_MISSED:
        _event(
            event.job_id,
            "missed",
            "the fire time passed beyond the policy's start window (the scheduler was down or busy)",
            when,
        )
    elif event.code == EVENT_JOB_MAX_INSTANCES:
        _event(event.job_id, "skipped", "the previous drill of this policy was still running", when)


class DrillScheduler:
    def __init__(
        self,
        policies: list[Policy],
        db_url: str,
        *,
        concurrency: int = 1,
        lease_ttl: float = 30.0,
        heartbeat: float = 5.0,
        grace: float = 60.0,
    ) -> None:
        missing = [p.name for p in policies if p.schedule is None]
        if missing:
            raise UsageError(
                f"policy {', '.join(missing)} has no schedule: section; it can only be run by hand or from cron"
            )
        self.policies = policies
        self.db_url = db_url
        self.concurrency = concurrency
        self.lease_ttl = lease_ttl
        self.heartbeat = heartbeat
        self.grace = grace
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.stop_event = threading.Event()

    def run(self) -> None:
        """Run until SIGTERM/SIGINT (or :meth:`stop`); raises :class:`SchedulerLocked`."""
        from drill.records.recorder import DatabaseRecorder

        db = open_database(self.db_url)
        records = Records(db)
        names = [p.name for p in self.policies]
        other = records.acquire_lease(self.holder, self.lease_ttl, names)
        if other is not None:
            db.close()
            raise SchedulerLocked(
                f"another scheduler holds this database's lease ({other['host']} pid {other['pid']}, heartbeat {other['heartbeat_at']}); "
                "only one may fire drills",
                hint=f"stop it first; if it died, its lease lapses at {other['expires_at']}",
            )
        DatabaseRecorder(db).reconcile()  # spooled verdicts first, then drills a dead process left
        from drill.scheduling.isolate import follow_jobs

        follow_jobs()
        _CONTEXT.db_url, _CONTEXT.holder = self.db_url, self.holder
        _CONTEXT.policies = {p.name: p for p in self.policies}
        _CONTEXT.stopping = self.stop_event
        scheduler = self._start_jobs(db)
        self._install_signals()
        scheduler.resume()
        log.info("scheduler %s started: %s", self.holder, ", ".join(names))
        try:
            while not self.stop_event.wait(self.heartbeat):
                if records.acquire_lease(self.holder, self.lease_ttl, names) is not None:
                    log.error("the lease was taken over; stopping")
                    break
                _deliver_spooled(db)
        finally:
            self.stop_event.set()  # a job firing from now on starts nothing
            self._wind_down(scheduler)
            records.release_lease(self.holder)
            db.close()
            log.info("scheduler %s stopped", self.holder)

    def _start_jobs(self, db: Any) -> Any:
        """APScheduler, paused, with one job per policy (and none for a policy no longer given)."""
        from apscheduler.executors.pool import ThreadPoolExecutor
        from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
        from apscheduler.schedulers.background import BackgroundScheduler

        from drill.policy.cron import cron_trigger

        scheduler = BackgroundScheduler(
            jobstores={"default": SQLAlchemyJobStore(engine=db.engine, tablename="apscheduler_jobs")},
            executors={"default": ThreadPoolExecutor(self.concurrency)},
            job_defaults={"coalesce": True, "max_instances": 1},
            timezone="UTC",
        )
        from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED

        scheduler.add_listener(_on_job_event, EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES)
        scheduler.start(paused=True)
        for job in scheduler.get_jobs():
            if job.id not in _CONTEXT.policies:
                job.remove()
        for p in self.policies:
            assert p.schedule is not None
            scheduler.add_job(
                fire,
                trigger=cron_trigger(p.schedule.cron, p.schedule.timezone),
                args=[p.name],
                id=p.name,
                name=p.name,
                replace_existing=True,
                misfire_grace_time=int(p.schedule.start_window),
                coalesce=True,
                max_instances=1,
            )
        return scheduler

    def _wind_down(self, scheduler: Any) -> None:
        """Running drills get the grace time to finish; then they are told to stop and each
        records itself ``aborted``."""
        from drill.scheduling.isolate import stop_children

        scheduler.pause()
        waiter = threading.Thread(target=scheduler.shutdown, kwargs={"wait": True}, daemon=True)
        waiter.start()
        waiter.join(self.grace)
        if waiter.is_alive():
            stop_children(grace=10.0)
            waiter.join(15.0)

    def stop(self) -> None:
        self.stop_event.set()

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop_event.set())


def _deliver_spooled(db: Any) -> None:
    """Each heartbeat: deliver what trainers spooled (their resumes and saves, recorded on the
    trainer's host for a few milliseconds each) into a spool directory this host shares."""
    from drill.records.recorder import DatabaseRecorder

    try:
        DatabaseRecorder(db).flush()
    except Exception:
        log.warning("spooled records not delivered this heartbeat", exc_info=True)
