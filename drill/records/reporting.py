"""What reports and metrics read: drills in a window, checkpoints, the ledger, the chain head."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from drill.pipeline.outcome import DrillOutcome
from drill.records.audit import ChainHead, chain_head
from drill.records.models import Checkpoint, Drill, FileVerification, proof_time
from drill.records.rows import outcome_from_row, outcome_loads
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
class DrillBrief:
    """One drill of a window, as counts, percentiles and coverage need it: no checks, no evidence."""

    id: int
    run_root: str
    started_at: datetime
    status: str
    policy: str | None
    checkpoint: str | None
    restore: float | None
    ttfs: float | None
    throughput: float | None


@dataclass(frozen=True, slots=True)
class Verified:
    """One file of the coverage ledger: its size and when its bytes last matched their seal."""

    size: int
    at: datetime


class ReportingMixin:
    _session: Callable[[], AbstractContextManager[Session]]  # provided by Records
    _attest: Callable[[Session, Iterable[DrillOutcome]], None]  # provided by Records

    def briefs_in_window(
        self,
        *,
        since: datetime | None,
        until: datetime | None = None,
        policy: str | None = None,
        run_root: str | None = None,
    ) -> list[DrillBrief]:
        """Every drill started in [``since``, ``until``), oldest first, in brief: a few columns
        each, so a month of a busy database's drills costs megabytes, not gigabytes."""
        with self._session() as s:
            q = select(
                Drill.id,
                Drill.run_root,
                Drill.started_at,
                Drill.status,
                Drill.policy,
                Checkpoint.uri,
                Drill.restore_seconds,
                Drill.ttfs_seconds,
                Drill.throughput_bps,
            ).outerjoin(Checkpoint, Drill.checkpoint_id == Checkpoint.id)
            q = q.order_by(Drill.started_at, Drill.id)
            if since is not None:
                q = q.where(Drill.started_at >= since)
            if until is not None:
                q = q.where(Drill.started_at < until)
            if policy is not None:
                q = q.where(Drill.policy == policy)
            if run_root is not None:
                q = q.where(Drill.run_root == run_root)
            return [
                DrillBrief(i, r, _aware(at), st, p, uri, rs, ts, bps)
                for i, r, at, st, p, uri, rs, ts, bps in s.execute(q)
            ]

    def outcomes(self, ids: list[int]) -> list[DrillOutcome]:
        """These drills in full, with their checks, oldest first."""
        out: list[DrillOutcome] = []
        with self._session() as s:
            for i in range(0, len(ids), 500):
                q = select(Drill).where(Drill.id.in_(ids[i : i + 500]))
                out += [
                    outcome_from_row(d, with_checks=True)
                    for d in s.scalars(q.options(*outcome_loads(with_checks=True)))
                ]
            self._attest(s, out)
        return sorted(out, key=lambda o: (o.started_at, o.id or 0))

    def run_roots(self, *, policy: str | None = None) -> list[str]:
        """Every run root drilled at least once (by ``policy``, when given)."""
        with self._session() as s:
            q = select(Drill.run_root).distinct()
            if policy is not None:
                q = q.where(Drill.policy == policy)
            return sorted(s.scalars(q))

    def known_checkpoints(
        self, run_root: str, *, seen_since: datetime | None = None, uris: Collection[str] | None = None
    ) -> list[KnownCheckpoint]:
        """The run's checkpoints as drills saw them (those seen since ``seen_since``, and of
        ``uris``, when given)."""
        out = []
        with self._session() as s:
            q = select(Checkpoint).where(Checkpoint.run_root == run_root).order_by(Checkpoint.step, Checkpoint.uri)
            if seen_since is not None:
                q = q.where(Checkpoint.last_seen >= seen_since)
            for part in _parts(uris):
                rows = s.scalars(q.where(Checkpoint.uri.in_(part)) if part is not None else q)
                out += [
                    KnownCheckpoint(
                        c.uri,
                        c.run_root,
                        c.step,
                        c.format,
                        c.bytes,
                        c.file_count,
                        _aware(c.first_seen),
                        _aware(c.last_seen),
                    )
                    for c in rows
                ]
        return out

    def latest_drills(self, run_root: str, uris: Collection[str] | None = None) -> dict[str, DrillOutcome]:
        """Checkpoint URI → its most recent closed drill (of any age), for ``uris`` (every
        checkpoint of the run when None): the checkpoints by URI, then each one's newest drill
        through the (checkpoint, id) index — one row per checkpoint read, whatever its history."""
        latest: dict[str, DrillOutcome] = {}
        with self._session() as s:
            q = select(Checkpoint.id).where(Checkpoint.run_root == run_root)
            ids = [
                i
                for part in _parts(uris)
                for i in s.scalars(q.where(Checkpoint.uri.in_(part)) if part is not None else q)
            ]
            for i in range(0, len(ids), 500):
                newest = select(func.max(Drill.id)).where(
                    Drill.checkpoint_id.in_(ids[i : i + 500]), Drill.status != DrillStatus.RUNNING.value
                )
                rows = select(Drill).where(Drill.id.in_(newest.group_by(Drill.checkpoint_id).scalar_subquery()))
                for d in s.scalars(rows.options(*outcome_loads(with_checks=False))):
                    latest[d.checkpoint.uri] = outcome_from_row(d, with_checks=False)  # type: ignore[union-attr]
            self._attest(s, latest.values())
        return latest

    def ledger(self, run_root: str, uris: Collection[str] | None = None) -> dict[str, list[Verified]]:
        """Checkpoint URI → the files whose bytes matched their seal, and when they last did
        (of ``uris`` only, when given)."""
        out: dict[str, list[Verified]] = {}
        with self._session() as s:
            q = select(Checkpoint.uri, FileVerification.size, proof_time()).join(
                FileVerification, FileVerification.checkpoint_id == Checkpoint.id
            )
            q = q.where(Checkpoint.run_root == run_root)
            for part in _parts(uris):
                for uri, size, at in s.execute(q.where(Checkpoint.uri.in_(part)) if part is not None else q):
                    out.setdefault(uri, []).append(Verified(int(size), _aware(at)))
        return out

    def sources(
        self,
    ) -> tuple[dict[tuple[str, str], tuple[DrillOutcome, DrillOutcome | None]], dict[tuple[str, str, str], int]]:
        """What the metrics read of every source — (policy or "", run root) — in one pass over
        the (policy, run root, status) index: its latest closed drill (with checks) and its
        latest passed one; and (policy or "", run root, status) → closed drills recorded, ever."""
        counts: dict[tuple[str, str, str], int] = {}
        last: dict[tuple[str, str], int] = {}
        good: dict[tuple[str, str], int] = {}
        with self._session() as s:
            q = select(Drill.policy, Drill.run_root, Drill.status, func.count(), func.max(Drill.id)).group_by(
                Drill.policy, Drill.run_root, Drill.status
            )
            for policy, root, status, n, newest in s.execute(q):
                if status == DrillStatus.RUNNING.value:
                    continue
                key = (policy or "", root)  # NULL and "" are one source
                counts[(*key, status)] = counts.get((*key, status), 0) + n
                last[key] = max(newest, last.get(key, newest))
                if status == DrillStatus.PASSED.value:
                    good[key] = max(newest, good.get(key, newest))
            load = select(Drill).where(Drill.id.in_({*last.values(), *good.values()}))
            rows = {d.id: d for d in s.scalars(load.options(*outcome_loads(with_checks=True)))}
            latest = {
                key: (
                    outcome_from_row(rows[i], with_checks=True),
                    outcome_from_row(rows[good[key]], with_checks=False) if key in good else None,
                )
                for key, i in last.items()
            }
            self._attest(s, [o for pair in latest.values() for o in pair if o is not None])
        return latest, counts

    def audit_head(self) -> ChainHead | None:
        with self._session() as s:
            return chain_head(s)


def _parts(uris: Collection[str] | None, size: int = 500) -> list[list[str] | None]:
    """``uris`` in slices an ``IN (…)`` takes; [None] for no restriction."""
    if uris is None:
        return [None]
    items = sorted(set(uris))
    return [items[i : i + size] for i in range(0, len(items), size)]


def _aware(t: datetime) -> datetime:
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)


__all__ = ["DrillBrief", "KnownCheckpoint", "ReportingMixin", "Verified"]
