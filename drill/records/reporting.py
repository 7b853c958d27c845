"""What reports and metrics read: drills in a window, checkpoints, the ledger, the chain head."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from drill.pipeline.outcome import DrillOutcome
from drill.records.audit import ChainHead, chain_head
from drill.records.models import Checkpoint, Drill, FileVerification
from drill.records.rows import outcome_from_row
from drill.verdict import DrillStatus


@dataclass(frozen=True, slots=True)
class KnownCheckpoint:
    """A checkpoint as the records know it (what drills saw; it may be gone from storage)."""

    uri: str
    run_root: str
    step: int | None
    format: str
    bytes: int | None
    files: int | None
    first_seen: datetime
    last_seen: datetime


@dataclass(frozen=True, slots=True)
class Verified:
    """One file of the coverage ledger: its size and when its bytes last matched their seal."""

    size: int
    at: datetime


class ReportingMixin:
    def _session(self) -> AbstractContextManager[Session]: ...  # provided by Records

    def drills_in_window(self, *, since: datetime | None, until: datetime | None = None, policy: str | None = None, run_root: str | None = None) -> list[DrillOutcome]:
        """Closed and running drills started in [``since``, ``until``), oldest first, with their checks."""
        with self._session() as s:
            q = select(Drill).order_by(Drill.started_at, Drill.id)
            q = q.options(selectinload(Drill.checkpoint), selectinload(Drill.checks), selectinload(Drill.replay_steps), selectinload(Drill.alerts))
            if since is not None:
                q = q.where(Drill.started_at >= since)
            if until is not None:
                q = q.where(Drill.started_at < until)
            if policy is not None:
                q = q.where(Drill.policy == policy)
            if run_root is not None:
                q = q.where(Drill.run_root == run_root)
            return [outcome_from_row(d, with_checks=True) for d in s.scalars(q)]

    def run_roots(self, *, policy: str | None = None) -> list[str]:
        """Every run root drilled at least once (by ``policy``, when given)."""
        with self._session() as s:
            q = select(Drill.run_root).distinct()
            if policy is not None:
                q = q.where(Drill.policy == policy)
            return sorted(s.scalars(q))

    def known_checkpoints(self, run_root: str) -> list[KnownCheckpoint]:
        with self._session() as s:
            rows = s.scalars(select(Checkpoint).where(Checkpoint.run_root == run_root).order_by(Checkpoint.step, Checkpoint.uri))
            return [KnownCheckpoint(c.uri, c.run_root, c.step, c.format, c.bytes, c.file_count, _aware(c.first_seen), _aware(c.last_seen)) for c in rows]

    def latest_drills(self, run_root: str) -> dict[str, DrillOutcome]:
        """Checkpoint URI → its most recent closed drill (of any age)."""
        with self._session() as s:
            q = (
                select(Drill)
                .join(Checkpoint, Drill.checkpoint_id == Checkpoint.id)
                .where(Checkpoint.run_root == run_root, Drill.status != DrillStatus.RUNNING.value)
                .order_by(Drill.id)
                .options(selectinload(Drill.checkpoint))
            )
            latest: dict[str, DrillOutcome] = {}
            for d in s.scalars(q):
                latest[d.checkpoint.uri] = outcome_from_row(d, with_checks=False)  # type: ignore[union-attr]
            return latest

    def ledger(self, run_root: str) -> dict[str, list[Verified]]:
        """Checkpoint URI → the files whose bytes matched their seal, and when they last did."""
        with self._session() as s:
            rows = s.execute(
                select(Checkpoint.uri, FileVerification.size, FileVerification.verified_at)
                .join(FileVerification, FileVerification.checkpoint_id == Checkpoint.id)
                .where(Checkpoint.run_root == run_root)
            )
            out: dict[str, list[Verified]] = {}
            for uri, size, at in rows:
                out.setdefault(uri, []).append(Verified(int(size), _aware(at)))
            return out

    def latest_per_source(self) -> dict[tuple[str, str], tuple[DrillOutcome, DrillOutcome | None]]:
        """(policy or "", run root) → (its latest closed drill, with checks; its latest passed one)."""
        with self._session() as s:
            source = (func.coalesce(Drill.policy, ""), Drill.run_root)
            closed = Drill.status != DrillStatus.RUNNING.value
            last = {(p, r): i for p, r, i in s.execute(select(*source, func.max(Drill.id)).where(closed).group_by(*source))}
            good = {(p, r): i for p, r, i in s.execute(select(*source, func.max(Drill.id)).where(Drill.status == DrillStatus.PASSED.value).group_by(*source))}
            load = select(Drill).where(Drill.id.in_({*last.values(), *good.values()}))
            rows = {d.id: d for d in s.scalars(load.options(selectinload(Drill.checkpoint), selectinload(Drill.checks), selectinload(Drill.replay_steps)))}
            return {
                key: (outcome_from_row(rows[i], with_checks=True), outcome_from_row(rows[good[key]], with_checks=False) if key in good else None)
                for key, i in last.items()
            }

    def drill_counts(self) -> dict[tuple[str, str, str], int]:
        """(policy or "", run root, status) → closed drills recorded, ever: what the metrics count."""
        with self._session() as s:
            source = (func.coalesce(Drill.policy, ""), Drill.run_root, Drill.status)
            q = select(*source, func.count()).where(Drill.status != DrillStatus.RUNNING.value).group_by(*source)
            return {(p, r, st): n for p, r, st, n in s.execute(q)}

    def audit_head(self) -> ChainHead | None:
        with self._session() as s:
            return chain_head(s)


def _aware(t: datetime) -> datetime:
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)


__all__ = ["KnownCheckpoint", "ReportingMixin", "Verified"]
