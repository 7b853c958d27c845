"""A :class:`~drill.pipeline.outcome.DrillOutcome` onto its row, and back.

A drill is one row: its columns, and its checks and replayed steps as one document
(``details``, migration 0014) — read and sealed as one. Drills recorded before it keep their
checks and steps as rows of ``check_results`` and ``replay_steps``, read as they were written.

Numbers that JSON and the databases disagree about are normalized on the way in: NaN and
±Inf in evidence and replayed steps become the strings ``"NaN"``/``"Infinity"``/``"-Infinity"``
(PostgreSQL's json rejects them).
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, object_session, selectinload

from drill import safe_json
from drill.errors import ExitCode
from drill.findings import CheckResult, jsonable
from drill.pipeline.outcome import CheckpointInfo, DrillOutcome, ReplaySummary, Timings
from drill.records.models import Alert, Checkpoint, CheckRecord, Document, Drill, ReplayStep
from drill.verdict import DrillStatus, exit_code_for

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


def _attempts(s: Session, d: Drill) -> dict[str, Any]:
    """A restarted batch job's drill names the attempts before it (its job id is theirs)."""
    if not d.job_id:
        return {}
    earlier = list(s.scalars(select(Drill.id).where(Drill.job_id == d.job_id, Drill.id < d.id).order_by(Drill.id)))
    return {"attempt": len(earlier) + 1, "earlier_attempts": earlier} if earlier else {}


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
    d.options = jsonable({**o.options, **_attempts(s, d)}) if o.options or d.job_id else None
    d.replay_verdict = o.replay.verdict if o.replay else None
    d.replay_reason = o.replay.reason if o.replay else None
    if o.checkpoint is not None:
        d.checkpoint_id = checkpoint_row(s, d.run_root, o.checkpoint).id
    s.execute(delete(CheckRecord).where(CheckRecord.drill_id == d.id))  # a drill recorded before 0014, closed now
    s.execute(delete(ReplayStep).where(ReplayStep.drill_id == d.id))
    d.details = details_of(s, o.checks, o.replay.steps if o.replay else [])


DOCUMENT_FROM = 2048
"""Bytes of a check's evidence from which it is stored once by its content (:class:`Document`)."""
REF = "$document"
"""The key of the evidence that names a :class:`Document` instead of holding it."""


def details_of(s: Session, checks: list[CheckResult], steps: list[dict[str, Any]]) -> dict[str, Any]:
    """A drill's checks and replayed steps as the one document its row holds (:attr:`Drill.details`);
    a large evidence (a model's tensor inventory: the same every night) stored once by its content."""
    out = []
    for check in checks:
        doc = check.to_dict()
        doc["evidence"] = stored_evidence(s, doc["evidence"])
        out.append(doc)
    return {"checks": out, "replay_steps": [jsonable(step) for step in steps]}


def stored_evidence(s: Session, evidence: dict[str, Any]) -> dict[str, Any]:
    body = json.dumps(evidence, sort_keys=True, separators=(",", ":"))
    if len(body) < DOCUMENT_FROM:
        return evidence
    digest = hashlib.sha256(body.encode()).hexdigest()
    from sqlalchemy.dialects import postgresql, sqlite

    insert = postgresql.insert if s.get_bind().dialect.name == "postgresql" else sqlite.insert
    s.execute(insert(Document).values(digest=digest, body=body).on_conflict_do_nothing(index_elements=["digest"]))
    return {REF: digest}


def evidence_of(s: Session | None, evidence: dict[str, Any]) -> dict[str, Any]:
    """A check's evidence as recorded: the :class:`Document` it names read back, once per
    session however many records name it (a document missing or not matching its name is
    evidence of that, never a crash — the record's seal says it is broken:
    :func:`drill.records.audit.attest`)."""
    digest = evidence.get(REF) if len(evidence) == 1 else None
    if not isinstance(digest, str):
        return evidence
    read: dict[str, dict[str, Any]] = s.info.setdefault("documents", {}) if s is not None else {}
    if digest not in read:
        read[digest] = _document(s, digest)
    return dict(read[digest])


def _document(s: Session | None, digest: str) -> dict[str, Any]:
    body = s.scalar(select(Document.body).where(Document.digest == digest)) if s is not None else None
    if body is None or hashlib.sha256(body.encode()).hexdigest() != digest:
        return {"unreadable": f"evidence document {digest} is missing or does not match its name"}
    try:
        doc = safe_json.loads(body)
    except ValueError:
        return {"unreadable": f"evidence document {digest} is not JSON"}
    return doc if isinstance(doc, dict) else {"unreadable": f"evidence document {digest} is not an object"}


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
        checks=_checks(d) if with_checks else [],
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


def _checks(d: Drill) -> list[CheckResult]:
    if d.details is not None:
        s = object_session(d)
        return [
            CheckResult.from_dict({**c, "evidence": evidence_of(s, dict(c.get("evidence") or {}))})
            for c in d.details.get("checks") or []
        ]
    return [_check(c) for c in d.checks]  # a drill recorded before migration 0014


def _replay(d: Drill, with_steps: bool) -> ReplaySummary | None:
    if d.replay_verdict is None:
        return None
    steps: list[dict[str, Any]] = []
    if with_steps and d.details is not None:
        steps = [dict(step) for step in d.details.get("replay_steps") or []]
    elif with_steps:
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


__all__ = [
    "REF",
    "Alert",
    "details_of",
    "evidence_of",
    "stored_evidence",
    "outcome_from_row",
    "outcome_loads",
    "write_outcome",
]
