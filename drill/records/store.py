"""Writing and reading drill records.

A drill row is committed when the drill starts and completed when it ends, each in its own
short transaction, so a crash mid-drill leaves a ``running`` row behind as a visible trace and
never rolls back a record already written.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, selectinload

from drill import __version__
from drill.errors import DatabaseError, NotFound
from drill.findings import CheckResult
from drill.records.db import Database, _reason, safe_url
from drill.records.models import Alert, Checkpoint, CheckRecord, Drill, FileVerification, ReplayStep, SchedulerLease


ORPHAN_REASON = "the process running this drill"


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(slots=True, kw_only=True)
class Timings:
    restore: float | None = None
    discover: float | None = None
    read: float | None = None
    load: float | None = None
    checks: float | None = None
    ttfs: float | None = None
    """Time to first step: drill start until the first replayed step finished."""


class Records:
    """The one place that reads and writes drill's tables."""

    def __init__(self, db: Database) -> None:
        self.db = db

    @contextmanager
    def _session(self) -> Iterator[Session]:
        try:
            with self.db.sessions.begin() as session:
                yield session
        except SQLAlchemyError as exc:
            raise DatabaseError(f"database {safe_url(self.db.url)}: {_reason(exc)}") from None

    # -- writing ----------------------------------------------------------------------------
    def begin_drill(self, *, run_root: str, selector: str, trigger: str, device: str, torch_version: str | None) -> int:
        with self._session() as s:
            drill = Drill(
                run_root=run_root,
                selector=selector,
                trigger=trigger,
                host=socket.gethostname(),
                pid=os.getpid(),
                device=device,
                started_at=utcnow(),
                status="running",
                phase="start",
                drill_version=__version__,
                torch_version=torch_version,
            )
            s.add(drill)
            s.flush()
            return drill.id

    def set_evidence_level(self, drill_id: int, *, sample: str, evidence_level: str) -> None:
        with self._session() as s:
            d = s.get_one(Drill, drill_id)
            d.sample = sample
            d.evidence_level = evidence_level

    def record_replay(self, drill_id: int, *, verdict: str, ttfs: float | None, steps: list[dict[str, Any]]) -> None:
        """The replay's verdict, time to first step, and each step's reference and replayed values."""
        with self._session() as s:
            d = s.get_one(Drill, drill_id)
            d.replay_verdict = verdict
            d.ttfs_seconds = ttfs
            for row in steps:
                s.add(ReplayStep(drill_id=drill_id, **row))

    def set_selection(self, drill_id: int, *, policy: str | None, selection: str) -> None:
        with self._session() as s:
            d = s.get_one(Drill, drill_id)
            d.policy = policy
            d.selection = selection

    def set_slo_breaches(self, drill_id: int, breaches: dict[str, Any]) -> None:
        with self._session() as s:
            s.get_one(Drill, drill_id).slo_breaches = breaches

    def last_drilled(self, run_root: str) -> dict[str, datetime]:
        """Checkpoint URI → when it was last drilled (any outcome), for coverage-aware selection."""
        from sqlalchemy import func

        with self._session() as s:
            rows = s.execute(
                select(Checkpoint.uri, func.max(Drill.started_at))
                .join(Drill, Drill.checkpoint_id == Checkpoint.id)
                .where(Checkpoint.run_root == run_root)
                .group_by(Checkpoint.uri)
            )
            return {uri: _aware(t) for uri, t in rows}

    def set_phase(self, drill_id: int, phase: str) -> None:
        with self._session() as s:
            s.get_one(Drill, drill_id).phase = phase

    @staticmethod
    def _checkpoint_row(s: Session, *, run_root: str, uri: str, step: int | None, format: str) -> Checkpoint:
        now = utcnow()
        ckpt = s.scalar(select(Checkpoint).where(Checkpoint.uri == uri))
        if ckpt is None:
            ckpt = Checkpoint(run_root=run_root, uri=uri, step=step, format=format, first_seen=now, last_seen=now)
            s.add(ckpt)
        ckpt.last_seen = now
        s.flush()
        return ckpt

    def ensure_checkpoint(self, *, run_root: str, uri: str, step: int | None, format: str) -> int:
        """The checkpoint's id, recording it first if it is new."""
        with self._session() as s:
            return self._checkpoint_row(s, run_root=run_root, uri=uri, step=step, format=format).id

    def attach_checkpoint(
        self, drill_id: int, *, run_root: str, uri: str, step: int | None, format: str, nbytes: int | None, file_count: int | None
    ) -> int:
        """Record (or refresh) the checkpoint and link the drill to it."""
        with self._session() as s:
            ckpt = self._checkpoint_row(s, run_root=run_root, uri=uri, step=step, format=format)
            if nbytes is not None:
                ckpt.bytes = nbytes
            if file_count is not None:
                ckpt.file_count = file_count
            s.get_one(Drill, drill_id).checkpoint_id = ckpt.id
            return ckpt.id

    def add_checks(self, drill_id: int, results: list[CheckResult]) -> None:
        with self._session() as s:
            for r in results:
                s.add(
                    CheckRecord(
                        drill_id=drill_id,
                        name=r.name,
                        status=r.status.value,
                        summary=r.summary,
                        evidence=_jsonable(r.evidence_document()),
                        seconds=r.seconds,
                    )
                )

    def finish_drill(
        self,
        drill_id: int,
        *,
        status: str,
        timings: Timings,
        bytes_read: int | None = None,
        error: str | None = None,
    ) -> None:
        with self._session() as s:
            d = s.get_one(Drill, drill_id)
            d.status = status
            d.finished_at = utcnow()
            d.error = error
            d.restore_seconds = timings.restore
            d.discover_seconds = timings.discover
            d.read_seconds = timings.read
            d.load_seconds = timings.load
            d.checks_seconds = timings.checks
            d.bytes_read = bytes_read
            busy = (timings.read or 0.0) + (timings.load or 0.0)
            d.throughput_bps = bytes_read / busy if bytes_read and busy > 0 else None

    def record_verified(self, checkpoint_id: int, drill_id: int | None, files: dict[str, tuple[int, str]]) -> None:
        """Ledger: these files (path → (size, digest)) just matched their sealed digests."""
        now = utcnow()
        with self._session() as s:
            rows = {
                r.path: r
                for r in s.scalars(select(FileVerification).where(FileVerification.checkpoint_id == checkpoint_id))
            }
            for path, (size, digest) in files.items():
                row = rows.get(path)
                if row is None:
                    row = FileVerification(checkpoint_id=checkpoint_id, path=path, size=size, xxh3_128=digest, verified_at=now)
                    s.add(row)
                row.size, row.xxh3_128, row.verified_at, row.drill_id = size, digest, now, drill_id

    def forget_verified(self, checkpoint_id: int, paths: set[str]) -> None:
        """Ledger: these files just failed verification; earlier proofs no longer hold."""
        if not paths:
            return
        with self._session() as s:
            for row in s.scalars(
                select(FileVerification).where(FileVerification.checkpoint_id == checkpoint_id, FileVerification.path.in_(paths))
            ):
                s.delete(row)

    def last_verified(self, checkpoint_id: int) -> dict[str, tuple[datetime, str]]:
        """Ledger: path → (when it last matched, the digest it matched)."""
        with self._session() as s:
            rows = s.scalars(select(FileVerification).where(FileVerification.checkpoint_id == checkpoint_id))
            return {r.path: (r.verified_at, r.xxh3_128) for r in rows}

    def coverage(self, checkpoint_id: int, files: dict[str, tuple[int, str]], days: float) -> float:
        """Fraction of ``files``' bytes (path → (size, sealed digest)) verified within ``days``."""
        total = sum(size for size, _ in files.values())
        if not total:
            return 1.0
        since = utcnow() - timedelta(days=days)
        seen = self.last_verified(checkpoint_id)
        fresh = sum(
            size for path, (size, digest) in files.items() if path in seen and seen[path][1] == digest and seen[path][0] >= since
        )
        return fresh / total

    def record_alerts(self, drill_id: int, deliveries: list[Any]) -> None:
        with self._session() as s:
            for d in deliveries:
                s.add(
                    Alert(
                        drill_id=drill_id,
                        channel=d.channel,
                        target=d.target,
                        delivered=d.delivered,
                        attempts=d.attempts,
                        error=d.error,
                        sent_at=utcnow(),
                    )
                )

    def running_drill_of(self, pid: int) -> int | None:
        """The drill a (child) process on this host left ``running``, if any."""
        with self._session() as s:
            return s.scalar(
                select(Drill.id)
                .where(Drill.pid == pid, Drill.host == socket.gethostname(), Drill.status == "running")
                .order_by(Drill.id.desc())
            )

    def close_dead_drill(self, drill_id: int, *, status: str, reason: str) -> None:
        """Finish a drill whose process died before it could: the record says how and where."""
        with self._session() as s:
            d = s.get_one(Drill, drill_id)
            # Another drill's orphan recovery may have closed it first, knowing only that the
            # process is gone; the parent that saw it die knows how, and says so.
            recovered = d.status == "aborted" and (d.error or "").startswith(ORPHAN_REASON)
            if d.status != "running" and not recovered:
                return
            d.status = status
            d.finished_at = utcnow()
            d.error = f"{reason} (last phase reached: {d.phase})"

    def record_lost_drill(self, *, run_root: str, trigger: str, policy: str | None, reason: str, status: str = "error") -> int:
        """A drill whose process died before it wrote a row: it still goes on the record."""
        drill_id = self.begin_drill(run_root=run_root, selector="policy", trigger=trigger, device="-", torch_version=None)
        with self._session() as s:
            d = s.get_one(Drill, drill_id)
            d.policy = policy
            d.status = status
            d.finished_at = utcnow()
            d.error = reason
        return drill_id

    def recover_orphans(self) -> list[int]:
        """Drills left ``running`` on this host by a process that is gone → ``aborted``."""
        host = socket.gethostname()
        with self._session() as s:
            rows = list(s.scalars(select(Drill).where(Drill.status == "running", Drill.host == host)))
            recovered = []
            for d in rows:
                if not _alive(d.pid):
                    d.status = "aborted"
                    d.finished_at = utcnow()
                    d.error = f"{ORPHAN_REASON} (pid {d.pid}) is gone: killed mid-drill (last phase reached: {d.phase})"
                    recovered.append(d.id)
            return recovered

    # -- the scheduler's lease --------------------------------------------------------------
    def acquire_lease(self, holder: str, ttl: float, policies: list[str]) -> dict[str, Any] | None:
        """Take (or renew) the scheduler lease; returns the other holder's row if it is live."""
        now = utcnow()
        with self._session() as s:
            lease = s.get(SchedulerLease, "scheduler", with_for_update=True)
            if lease is not None and lease.holder != holder and _aware(lease.expires_at) > now:
                return {
                    "holder": lease.holder,
                    "host": lease.host,
                    "pid": lease.pid,
                    "heartbeat_at": _aware(lease.heartbeat_at).isoformat(),
                    "expires_at": _aware(lease.expires_at).isoformat(),
                }
            if lease is None:
                lease = SchedulerLease(name="scheduler", holder=holder, host=socket.gethostname(), pid=os.getpid(), started_at=now, heartbeat_at=now, expires_at=now)
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
            return lease is not None and lease.holder == holder and _aware(lease.expires_at) > utcnow()

    def release_lease(self, holder: str) -> None:
        with self._session() as s:
            lease = s.get(SchedulerLease, "scheduler")
            if lease is not None and lease.holder == holder:
                lease.expires_at = utcnow()

    def scheduler_state(self) -> dict[str, Any]:
        """The lease (is a scheduler alive?) and each scheduled job's next fire time."""
        from sqlalchemy import text

        with self._session() as s:
            lease = s.get(SchedulerLease, "scheduler")
            jobs = {row[0]: row[1] for row in s.execute(text("SELECT id, next_run_time FROM apscheduler_jobs"))}
            now = utcnow()
            doc: dict[str, Any] = {"alive": False, "scheduler": None, "jobs": {}}
            if lease is not None:
                doc["alive"] = _aware(lease.expires_at) > now
                doc["scheduler"] = {
                    "host": lease.host,
                    "pid": lease.pid,
                    "started_at": _aware(lease.started_at).isoformat(),
                    "heartbeat_at": _aware(lease.heartbeat_at).isoformat(),
                    "heartbeat_age_seconds": (now - _aware(lease.heartbeat_at)).total_seconds(),
                    "policies": (lease.policies or {}).get("names", []),
                }
            for name, ts in jobs.items():
                doc["jobs"][name] = None if ts is None else datetime.fromtimestamp(ts, timezone.utc).isoformat()
            return doc

    def policy_summary(self, policy: str) -> dict[str, Any]:
        """The policy's last drill and its history counted by status (SLO breaches apart)."""
        from sqlalchemy import func

        with self._session() as s:
            last = s.scalar(select(Drill).where(Drill.policy == policy).order_by(Drill.id.desc()).options(selectinload(Drill.checkpoint)))
            counts = dict(s.execute(select(Drill.status, func.count()).where(Drill.policy == policy).group_by(Drill.status)).all())
            return {"last": drill_document(last) if last else None, "counts": counts}

    def last_good(self, run_root: str, retained: list[str]) -> dict[str, Any] | None:
        """The newest of ``retained`` (URIs, oldest first) whose latest drill passed."""
        with self._session() as s:
            for uri in reversed(retained):
                latest = s.scalar(
                    select(Drill)
                    .join(Checkpoint, Drill.checkpoint_id == Checkpoint.id)
                    .where(Checkpoint.uri == uri, Drill.status != "running")
                    .order_by(Drill.id.desc())
                    .options(selectinload(Drill.checkpoint))
                )
                if latest is not None and latest.status == "passed":
                    return drill_document(latest)
            return None

    # -- reading ----------------------------------------------------------------------------
    def history(self, *, run_root: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        with self._session() as s:
            q = select(Drill).options(selectinload(Drill.checkpoint)).order_by(Drill.id.desc()).limit(limit)
            if run_root is not None:
                q = q.where(Drill.run_root == run_root)
            return [drill_document(d) for d in s.scalars(q)]

    def get(self, drill_id: int) -> dict[str, Any]:
        with self._session() as s:
            d = s.scalar(
                select(Drill)
                .where(Drill.id == drill_id)
                .options(selectinload(Drill.checkpoint), selectinload(Drill.checks), selectinload(Drill.replay_steps))
            )
            if d is None:
                raise NotFound(f"no drill with id {drill_id}")
            return drill_document(d, with_checks=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _aware(t: datetime) -> datetime:
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t


def drill_document(d: Drill, *, with_checks: bool = False) -> dict[str, Any]:
    """A drill as the JSON document ``drill history/show --json`` print."""
    ckpt = d.checkpoint
    doc: dict[str, Any] = {
        "id": d.id,
        "status": d.status,
        "run_root": d.run_root,
        "selector": d.selector,
        "checkpoint": None
        if ckpt is None
        else {"uri": ckpt.uri, "step": ckpt.step, "format": ckpt.format, "bytes": ckpt.bytes, "files": ckpt.file_count},
        "trigger": d.trigger,
        "host": d.host,
        "pid": d.pid,
        "device": d.device,
        "started_at": d.started_at.isoformat(),
        "finished_at": d.finished_at.isoformat() if d.finished_at else None,
        "phase": d.phase,
        "error": d.error,
        "restore_seconds": d.restore_seconds,
        "phases": {
            "discover": d.discover_seconds,
            "read": d.read_seconds,
            "load": d.load_seconds,
            "checks": d.checks_seconds,
        },
        "bytes_read": d.bytes_read,
        "throughput_bps": d.throughput_bps,
        "drill_version": d.drill_version,
        "torch_version": d.torch_version,
        "sample": d.sample,
        "evidence_level": d.evidence_level,
        "ttfs_seconds": d.ttfs_seconds,
        "replay_verdict": d.replay_verdict,
        "policy": d.policy,
        "selection": d.selection,
        "slo_breaches": d.slo_breaches,
    }
    if with_checks:
        doc["replay_steps"] = [
            {
                "step": r.step,
                "reference_loss": r.reference_loss,
                "loss": r.loss,
                "reference_grad_norm": r.reference_grad_norm,
                "grad_norm": r.grad_norm,
                "reference_batch": r.reference_batch,
                "batch": r.batch,
                "matches": r.matches,
            }
            for r in d.replay_steps
        ]
        doc["checks"] = [
            {"name": c.name, "status": c.status, "summary": c.summary, "seconds": c.seconds, "evidence": c.evidence}
            for c in d.checks
        ]
    return doc


def _jsonable(value: Any) -> Any:
    """Evidence as plain JSON: tuples to lists, anything exotic to its ``str``."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
