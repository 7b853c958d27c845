"""The scheduler's lease (one scheduler fires drills per database) and what it reports."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from drill.records.models import Drill, SchedulerEvent, SchedulerLease


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def aware(t: datetime) -> datetime:
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t


class LeaseMixin:
    _session: Callable[[], AbstractContextManager[Session]]  # provided by Records

    def acquire_lease(self, holder: str, ttl: float, policies: list[str]) -> dict[str, Any] | None:
        """Take (or renew) the scheduler lease; returns the other holder's row if it is live."""
        now = utcnow()
        with self._session() as s:
            lease = s.get(SchedulerLease, "scheduler", with_for_update=True)
            if lease is not None and lease.holder != holder and aware(lease.expires_at) > now:
                return {
                    "holder": lease.holder,
                    "host": lease.host,
                    "pid": lease.pid,
                    "heartbeat_at": aware(lease.heartbeat_at).isoformat(),
                    "expires_at": aware(lease.expires_at).isoformat(),
                }
            if lease is None:
                lease = SchedulerLease(
                    name="scheduler",
                    holder=holder,
                    host=socket.gethostname(),
                    pid=os.getpid(),
                    started_at=now,
                    heartbeat_at=now,
                    expires_at=now,
                )
                s.add(lease)
            if lease.holder != holder:
                lease.started_at = now
            lease.holder, lease.host, lease.pid = holder, socket.gethostname(), os.getpid()
            lease.heartbeat_at = now
            lease.expires_at = now + timedelta(seconds=ttl)
            lease.policies = {"names": policies}
        return None

    def holds_lease(self, holder: str) -> bool:
        with self._session() as s:
            lease = s.get(SchedulerLease, "scheduler")
            return lease is not None and lease.holder == holder and aware(lease.expires_at) > utcnow()

    def release_lease(self, holder: str) -> None:
        with self._session() as s:
            lease = s.get(SchedulerLease, "scheduler")
            if lease is not None and lease.holder == holder:
                lease.expires_at = utcnow()

    def scheduler_event(
        self,
        policy: str,
        kind: str,
        reason: str,
        *,
        scheduled_for: datetime | None = None,
        exit_code: int | None = None,
        holder: str | None = None,
    ) -> None:
        """A scheduled drill that did not run, and why (see :class:`~drill.records.models.SchedulerEvent`)."""
        with self._session() as s:
            s.add(
                SchedulerEvent(
                    policy=policy,
                    kind=kind,
                    reason=reason[:10000],
                    scheduled_for=scheduled_for,
                    at=utcnow(),
                    exit_code=exit_code,
                    holder=holder,
                )
            )

    def scheduler_events(
        self, *, policy: str | None = None, since: datetime | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """The newest scheduler events first."""
        with self._session() as s:
            q = select(SchedulerEvent).order_by(SchedulerEvent.id.desc()).limit(limit)
            if policy is not None:
                q = q.where(SchedulerEvent.policy == policy)
            if since is not None:
                q = q.where(SchedulerEvent.at >= since)
            return [
                {"policy": e.policy, "kind": e.kind, "at": aware(e.at).isoformat(), "scheduled_for": aware(e.scheduled_for).isoformat() if e.scheduled_for else None,
                 "reason": e.reason, "exit_code": e.exit_code}
                for e in s.scalars(q)
            ]  # fmt: skip

    def scheduler_event_counts(self) -> dict[tuple[str, str], int]:
        """(policy, kind) → how many, ever: what the metrics count."""
        from sqlalchemy import func

        with self._session() as s:
            return {
                (p, k): n
                for p, k, n in s.execute(
                    select(SchedulerEvent.policy, SchedulerEvent.kind, func.count()).group_by(
                        SchedulerEvent.policy, SchedulerEvent.kind
                    )
                )
            }

    def scheduler_state(self) -> dict[str, Any]:
        """The lease (is a scheduler alive?) and each scheduled job's next fire time."""
        from sqlalchemy import text

        with self._session() as s:
            lease = s.get(SchedulerLease, "scheduler")
            jobs = {row[0]: row[1] for row in s.execute(text("SELECT id, next_run_time FROM apscheduler_jobs"))}
            now = utcnow()
            doc: dict[str, Any] = {"alive": False, "scheduler": None, "jobs": {}}
            if lease is not None:
                doc["alive"] = aware(lease.expires_at) > now
                doc["scheduler"] = {
                    "host": lease.host,
                    "pid": lease.pid,
                    "started_at": aware(lease.started_at).isoformat(),
                    "heartbeat_at": aware(lease.heartbeat_at).isoformat(),
                    "heartbeat_age_seconds": (now - aware(lease.heartbeat_at)).total_seconds(),
                    "policies": (lease.policies or {}).get("names", []),
                }
            for name, ts in jobs.items():
                doc["jobs"][name] = None if ts is None else datetime.fromtimestamp(ts, timezone.utc).isoformat()
            return doc

    def policy_summary(self, policy: str) -> dict[str, Any]:
        """The policy's last drill and its history counted by status (SLO breaches apart)."""
        from sqlalchemy import func

        from drill.records.rows import outcome_from_row, outcome_loads

        with self._session() as s:
            last = s.scalar(
                select(Drill)
                .where(Drill.policy == policy)
                .order_by(Drill.id.desc())
                .options(*outcome_loads(with_checks=False))
            )
            counts = dict(
                s.execute(select(Drill.status, func.count()).where(Drill.policy == policy).group_by(Drill.status)).all()
            )
            return {
                "last": outcome_from_row(last, with_checks=False).to_document(with_checks=False) if last else None,
                "counts": counts,
            }
