"""A :class:`~drill.pipeline.outcome.DrillOutcome` onto its rows, and back.

Numbers that JSON and the databases disagree about are normalized on the way in: NaN and
±Inf in evidence become the strings ``"NaN"``/``"Infinity"``/``"-Infinity"`` (PostgreSQL's
json rejects them), and a non-finite replay value is stored as NULL in its float column with
its text in ``nonfinite`` (SQLite turns NaN into NULL, which a NOT NULL column rejects).
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, selectinload

from drill.errors import ExitCode
from drill.findings import CheckResult, jsonable
from drill.pipeline.outcome import CheckpointInfo, DrillOutcome, ReplaySummary, Timings
from drill.records.models import Alert, Checkpoint, CheckRecord, Drill, ReplayStep
from drill.verdict import DrillStatus, exit_code_for

_FLOATS = ("reference_loss", "loss", "reference_grad_norm", "grad_norm")
_TIMINGS = ("restore", "discover", "plan", "read", "load", "checks", "replay", "ttfs")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def checkpoint_row(s: Session, run_root: str, info: Any) -> Checkpoint:
    now = utcnow()
    ckpt = s.scalar(select(Checkpoint).where(Checkpoint.uri == info.uri))
    if ckpt is None:
        # Two drills of a new checkpoint at once both find no row: insert-or-nothing, then read
        # back whichever insert won (a plain INSERT would fail the second on the unique uri).
        from sqlalchemy.dialects import postgresql, sqlite

        insert = postgresql.insert if s.get_bind().dialect.name == "postgresql" else sqlite.insert
        values = {
            "run_root": run_root,
            "uri": info.uri,
            "step": info.step,
            "format": info.format,
            "first_seen": now,
            "last_seen": now,
        }
        s.execute(insert(Checkpoint).values(**values).on_conflict_do_nothing(index_elements=["uri"]))
        ckpt = s.scalars(select(Checkpoint).where(Checkpoint.uri == info.uri)).one()
    ckpt.last_seen = now
    if info.bytes is not None:
        ckpt.bytes = info.bytes
    if info.files is not None:
        ckpt.file_count = info.files
    s.flush()
    return ckpt


def check_row(drill_id: int, result: CheckResult) -> CheckRecord:
    doc = result.to_dict()
    evidence = {**doc["evidence"], "findings": doc["findings"]}
    return CheckRecord(
        drill_id=drill_id,
        name=result.name,
        status=doc["status"],
        summary=result.summary,
        evidence=evidence,
        seconds=result.seconds,
    )


def replay_rows(drill_id: int, steps: list[dict[str, Any]]) -> list[ReplayStep]:
    rows = []
    for step in steps:
        values = dict(step)
        nonfinite = {}
        for key in _FLOATS:
            v = values.get(key)
            if isinstance(v, str) or (isinstance(v, float) and not math.isfinite(v)):
                nonfinite[key] = jsonable(v)
                values[key] = None
        rows.append(
            ReplayStep(
                drill_id=drill_id,
                nonfinite=nonfinite or None,
                **{k: values.get(k) for k in ("step", "batch", "reference_batch", "matches", *_FLOATS)},
            )
        )
    return rows


def write_outcome(s: Session, d: Drill, o: DrillOutcome) -> None:
    """Everything the outcome says, onto the drill's row and its child rows (idempotent)."""
    d.status, d.exit_code, d.message, d.error = o.status.value, int(o.exit_code), o.message, o.error
    d.finished_at, d.phase, d.selection, d.policy = o.finished_at, o.phase, o.selection, o.policy
    d.evidence_level, d.sample, d.slo_breaches = o.evidence_level, o.sample, jsonable(o.slo_breaches) or None
    t = o.timings
    d.restore_seconds, d.discover_seconds, d.plan_seconds, d.read_seconds = t.restore, t.discover, t.plan, t.read
    d.load_seconds, d.checks_seconds, d.replay_seconds, d.ttfs_seconds = t.load, t.checks, t.replay, t.ttfs
    d.bytes_read, d.throughput_bps = o.bytes_read, o.throughput_bps
    d.distributed, d.job_id = jsonable(o.distributed) if o.distributed else None, o.job_id
    d.page_cache = jsonable(o.page_cache) if o.page_cache else None
    d.options = jsonable(o.options) if o.options else None
    d.replay_verdict = o.replay.verdict if o.replay else None
    d.replay_reason = o.replay.reason if o.replay else None
    if o.checkpoint is not None:
        d.checkpoint_id = checkpoint_row(s, d.run_root, o.checkpoint).id
    s.execute(delete(CheckRecord).where(CheckRecord.drill_id == d.id))
    s.execute(delete(ReplayStep).where(ReplayStep.drill_id == d.id))
    s.add_all(check_row(d.id, c) for c in o.checks)
    s.add_all(replay_rows(d.id, o.replay.steps if o.replay else []))


def outcome_loads(*, with_checks: bool) -> list[Any]:
    """What a query of :class:`Drill` rows loads with them for :func:`outcome_from_row` (same
    ``with_checks``): each relation it reads in one query per batch of drills, never one per drill."""
    loads = [selectinload(Drill.checkpoint), selectinload(Drill.alerts)]
    if with_checks:
        loads += [selectinload(Drill.checks), selectinload(Drill.replay_steps)]
    return loads


def outcome_from_row(d: Drill, *, with_checks: bool) -> DrillOutcome:
    """The outcome a drill's row records (its rows loaded as :func:`outcome_loads` says)."""
    ck = d.checkpoint
    status = DrillStatus(d.status)
    exit_code = ExitCode(d.exit_code) if d.exit_code is not None else exit_code_for(status)
    return DrillOutcome(
        id=d.id,
        status=status,
        exit_code=exit_code,
        message=d.message if d.message is not None else _first_line(d.error),
        run_root=d.run_root,
        selector=d.selector,
        trigger=d.trigger,
        host=d.host,
        pid=d.pid,
        device=d.device,
        started_at=_aware(d.started_at),
        finished_at=_aware(d.finished_at) if d.finished_at else None,
        phase=d.phase,
        checkpoint=None
        if ck is None
        else CheckpointInfo(
            uri=ck.uri, name=_name(ck.uri), step=ck.step, format=ck.format, bytes=ck.bytes, files=ck.file_count
        ),
        policy=d.policy,
        selection=d.selection,
        timings=Timings(**{n: getattr(d, f"{n}_seconds") for n in _TIMINGS}),
        bytes_read=d.bytes_read,
        evidence_level=d.evidence_level,
        sample=d.sample,
        replay=_replay(d, with_checks),
        slo_breaches=dict(d.slo_breaches or {}),
        checks=[_check(c) for c in d.checks] if with_checks else [],
        error=d.error,
        versions={"drill": d.drill_version, "torch": d.torch_version},
        distributed=dict(d.distributed) if d.distributed else None,
        page_cache=dict(d.page_cache) if d.page_cache else None,
        job_id=d.job_id,
        options=dict(d.options) if d.options else {},
        alerts=[
            {
                "channel": a.channel,
                "target": a.target,
                "delivered": a.delivered,
                "attempts": a.attempts,
                "error": a.error,
            }
            for a in d.alerts
        ],
    )


def _replay(d: Drill, with_steps: bool) -> ReplaySummary | None:
    if d.replay_verdict is None:
        return None
    steps = []
    if with_steps:
        for r in d.replay_steps:
            row = {
                k: getattr(r, k)
                for k in (
                    "step",
                    "reference_loss",
                    "loss",
                    "reference_grad_norm",
                    "grad_norm",
                    "reference_batch",
                    "batch",
                    "matches",
                )
            }
            row.update(r.nonfinite or {})
            steps.append(row)
    return ReplaySummary(verdict=d.replay_verdict, reason=d.replay_reason or "", steps=steps)


def _check(c: CheckRecord) -> CheckResult:
    evidence = dict(c.evidence or {})
    findings = evidence.pop("findings", [])
    return CheckResult.from_dict(
        {
            "name": c.name,
            "status": c.status,
            "summary": c.summary,
            "seconds": c.seconds,
            "findings": findings,
            "evidence": evidence,
        }
    )


def _name(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


def _first_line(text: str | None) -> str | None:
    return text.strip().splitlines()[0] if text and text.strip() else None


def _aware(t: datetime) -> datetime:
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)


__all__ = ["Alert", "check_row", "outcome_from_row", "outcome_loads", "replay_rows", "write_outcome"]
