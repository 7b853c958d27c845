"""SQLAlchemy 2.0 typed models of drill's records."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    case,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeDecorator

from drill.text import lossless


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC in and out, also on SQLite (which stores naive text)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("drill stores aware datetimes only")
        return value.astimezone(timezone.utc)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


class Str(TypeDecorator[str]):
    """A string column that takes any text drill was given: a file name's stray bytes (lone
    surrogates, which no database encodes) are stored as ``\\xNN`` (:func:`drill.text.lossless`)."""

    impl = String
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Any) -> str | None:
        return lossless(value) if isinstance(value, str) else value


class LongText(Str):
    impl = Text
    cache_ok = True


class JSONDocument(TypeDecorator[Any]):
    """A JSON document: ``jsonb`` on PostgreSQL (as the migrations create it), JSON elsewhere.
    PostgreSQL's type is loaded with its dialect, when a database of it is opened: importing
    the dialect for the type alone cost every command on SQLite 50 ms."""

    impl = JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: Any) -> Any:
        if dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import JSONB

            return dialect.type_descriptor(JSONB())
        return dialect.type_descriptor(JSON())


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime, dict[str, Any]: JSONDocument}


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (Index("ix_checkpoints_run_root_last_seen", "run_root", "last_seen"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_root: Mapped[str] = mapped_column(Str(2048), index=True)
    uri: Mapped[str] = mapped_column(Str(2048), unique=True)
    step: Mapped[int | None] = mapped_column(BigInteger)
    format: Mapped[str] = mapped_column(Str(32))
    bytes: Mapped[int | None] = mapped_column(BigInteger)
    file_count: Mapped[int | None] = mapped_column(Integer)
    first_seen: Mapped[datetime]
    last_seen: Mapped[datetime]
    proofs_verified_at: Mapped[datetime | None]
    """When every proof of its coverage ledger then stored was made again at once (a nightly
    verification of the unchanged checkpoint): a proof's time is the later of its own and this
    (:func:`proof_time`)."""
    proofs_fingerprint: Mapped[str | None] = mapped_column(Str(32))
    """The fingerprint of its ledger's proofs (:func:`drill.integrity.coverage.proofs_fingerprint`),
    kept by every write: a verification that made exactly those proofs again knows it without
    reading them."""

    drills: Mapped[list[Drill]] = relationship(back_populates="checkpoint")


class Drill(Base):
    __tablename__ = "drills"
    __table_args__ = (
        Index("ix_drills_run_root_started_at", "run_root", "started_at"),
        Index("ix_drills_checkpoint_id_id", "checkpoint_id", "id"),
        Index("ix_drills_source_status", "policy", "run_root", "status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    checkpoint_id: Mapped[int | None] = mapped_column(ForeignKey("checkpoints.id"), index=True)
    run_root: Mapped[str] = mapped_column(Str(2048), index=True)
    selector: Mapped[str] = mapped_column(Str(2048))
    trigger: Mapped[str] = mapped_column(Str(32))
    host: Mapped[str] = mapped_column(Str(255))
    pid: Mapped[int] = mapped_column(Integer)
    device: Mapped[str] = mapped_column(Str(64))
    started_at: Mapped[datetime] = mapped_column(index=True)
    finished_at: Mapped[datetime | None]
    status: Mapped[str] = mapped_column(Str(16), index=True)
    """A :class:`drill.verdict.DrillStatus` value."""
    exit_code: Mapped[int | None] = mapped_column(Integer)
    message: Mapped[str | None] = mapped_column(LongText)
    """Why the drill did not pass, in one line."""
    process_start: Mapped[int | None] = mapped_column(BigInteger)
    """The drill process's start time (clock ticks since boot): a reused pid is not the drill."""
    phase: Mapped[str] = mapped_column(Str(32))
    """The last phase reached: where a crashed or aborted drill stopped."""
    error: Mapped[str | None] = mapped_column(LongText)
    restore_seconds: Mapped[float | None] = mapped_column(Float)
    """Drill start until the state was on the device: discover + read + load."""
    discover_seconds: Mapped[float | None] = mapped_column(Float)
    read_seconds: Mapped[float | None] = mapped_column(Float)
    load_seconds: Mapped[float | None] = mapped_column(Float)
    plan_seconds: Mapped[float | None] = mapped_column(Float)
    checks_seconds: Mapped[float | None] = mapped_column(Float)
    replay_seconds: Mapped[float | None] = mapped_column(Float)
    bytes_read: Mapped[int | None] = mapped_column(BigInteger)
    throughput_bps: Mapped[float | None] = mapped_column(Float)
    """Bytes read per second of read + load."""
    drill_version: Mapped[str] = mapped_column(Str(32))
    torch_version: Mapped[str | None] = mapped_column(Str(64))
    sample: Mapped[str | None] = mapped_column(Str(64))
    """``all`` or the sampling spec: a sampled drill says it was sampled."""
    evidence_level: Mapped[str | None] = mapped_column(Str(16))
    """``sealed`` (content hashes) or ``unsealed`` (structural proof only)."""
    ttfs_seconds: Mapped[float | None] = mapped_column(Float)
    """Time to first step: drill start until the first replayed training step finished."""
    replay_verdict: Mapped[str | None] = mapped_column(Str(32))
    """``passed``, ``diverged``, ``not replayable`` or ``error``."""
    replay_reason: Mapped[str | None] = mapped_column(LongText)
    policy: Mapped[str | None] = mapped_column(Str(255), index=True)
    selection: Mapped[str | None] = mapped_column(LongText)
    """How the checkpoint was chosen (with the seed of a random choice)."""
    slo_breaches: Mapped[dict[str, Any] | None]
    distributed: Mapped[dict[str, Any] | None]
    """A drill run by many ranks: per-rank figures, balance, the slowest rank."""
    page_cache: Mapped[dict[str, Any] | None]
    """Cold or warm: how much of the checkpoint this host had cached when the restore began."""
    job_id: Mapped[str | None] = mapped_column(Str(128), index=True)
    """The batch job that ran it (``slurm:1234``)."""
    options: Mapped[dict[str, Any] | None]
    """How it was asked for: the ``drill run`` flags that repeat it, its policy file, the parts it
    accepted as missing (see :meth:`~drill.pipeline.request.DrillRequest.options`)."""
    details: Mapped[dict[str, Any] | None]
    """Its checks and replayed steps, as one document — ``{"checks": [CheckResult.to_dict()],
    "replay_steps": [...]}`` — on the drill's own row: a record is one row, read and sealed as one
    (migration 0014). NULL on drills recorded before it, whose checks and steps are rows of
    ``check_results`` and ``replay_steps``."""

    checkpoint: Mapped[Checkpoint | None] = relationship(back_populates="drills")
    checks: Mapped[list[CheckRecord]] = relationship(
        back_populates="drill", order_by="CheckRecord.id", cascade="all, delete-orphan"
    )
    replay_steps: Mapped[list[ReplayStep]] = relationship(order_by="ReplayStep.step", cascade="all, delete-orphan")
    alerts: Mapped[list[Alert]] = relationship(order_by="Alert.id", cascade="all, delete-orphan")


class CheckRecord(Base):
    __tablename__ = "check_results"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    drill_id: Mapped[int] = mapped_column(ForeignKey("drills.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(Str(64))
    status: Mapped[str] = mapped_column(Str(16))
    summary: Mapped[str] = mapped_column(LongText)
    evidence: Mapped[dict[str, Any]]
    seconds: Mapped[float] = mapped_column(Float)

    drill: Mapped[Drill] = relationship(back_populates="checks")


class Document(Base):
    """A check's evidence, stored once by its content (``details`` names it ``{"$document":
    SHA-256}``): the same inventory a run's every nightly drill records is one row, not one a
    drill. Self-verifying: its key is the SHA-256 of its body (migration 0014)."""

    __tablename__ = "documents"

    digest: Mapped[str] = mapped_column(Str(64), primary_key=True)
    body: Mapped[str] = mapped_column(LongText)


class FileVerification(Base):
    """The coverage ledger: the last time each file's bytes matched its sealed digest."""

    __tablename__ = "file_verifications"
    __table_args__ = (UniqueConstraint("checkpoint_id", "path", name="uq_file_verifications_checkpoint_path"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    checkpoint_id: Mapped[int] = mapped_column(ForeignKey("checkpoints.id", ondelete="CASCADE"))
    path: Mapped[str] = mapped_column(Str(1024))
    size: Mapped[int] = mapped_column(BigInteger)
    xxh3_128: Mapped[str] = mapped_column(Str(32))
    verified_at: Mapped[datetime]
    drill_id: Mapped[int | None] = mapped_column(ForeignKey("drills.id", ondelete="SET NULL"))


def proof_time() -> ColumnElement[datetime]:
    """When a ledger row's file last matched its digest: the later of the row's own time and
    its checkpoint's sweep (:attr:`Checkpoint.proofs_verified_at`) — for a query that joins the
    two. (:mod:`drill.records.lite` asks the same in its own SQL.)"""
    return case(
        (Checkpoint.proofs_verified_at > FileVerification.verified_at, Checkpoint.proofs_verified_at),
        else_=FileVerification.verified_at,
    )


class ReplayStep(Base):
    """One replayed step next to what the original run logged for it."""

    __tablename__ = "replay_steps"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    drill_id: Mapped[int] = mapped_column(ForeignKey("drills.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(BigInteger)
    reference_loss: Mapped[float | None] = mapped_column(Float)
    loss: Mapped[float | None] = mapped_column(Float)
    reference_grad_norm: Mapped[float | None] = mapped_column(Float)
    grad_norm: Mapped[float | None] = mapped_column(Float)
    reference_batch: Mapped[str | None] = mapped_column(Str(64))
    batch: Mapped[str | None] = mapped_column(Str(64))
    matches: Mapped[bool] = mapped_column(Boolean)
    nonfinite: Mapped[dict[str, Any] | None]
    """Values that are NaN or ±Inf (``{"loss": "NaN"}``), whose float column holds NULL:
    SQLite turns NaN into NULL and PostgreSQL's json rejects it, so they are stored as text."""


class Alert(Base):
    __tablename__ = "alerts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    drill_id: Mapped[int] = mapped_column(ForeignKey("drills.id", ondelete="CASCADE"), index=True)
    channel: Mapped[str] = mapped_column(Str(16))
    target: Mapped[str] = mapped_column(Str(512))
    """Where it went, secrets masked."""
    delivered: Mapped[bool] = mapped_column(Boolean)
    attempts: Mapped[int] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(LongText)
    sent_at: Mapped[datetime]


class SchedulerLease(Base):
    """One row: which scheduler may fire jobs, and its heartbeat."""

    __tablename__ = "scheduler_lease"

    name: Mapped[str] = mapped_column(Str(64), primary_key=True)
    holder: Mapped[str] = mapped_column(Str(255))
    host: Mapped[str] = mapped_column(Str(255))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime]
    heartbeat_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    policies: Mapped[dict[str, Any] | None]


class SchedulerEvent(Base):
    """A scheduled drill that did not run, and why: a missed fire time, a run still going, a
    preflight refusal (the run root gone, the storage refusing), a scheduler stopping. What a
    drill record is not — nothing was drilled — but an operator must still see."""

    __tablename__ = "scheduler_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    policy: Mapped[str] = mapped_column(Str(255), index=True)
    kind: Mapped[str] = mapped_column(Str(16))
    """``missed`` (fire time passed beyond the start window), ``skipped`` (not started: still
    running, stopping, lease lost), ``refused`` (the drill's preflight refused it), ``error``."""
    scheduled_for: Mapped[datetime | None]
    at: Mapped[datetime] = mapped_column(index=True)
    reason: Mapped[str] = mapped_column(LongText)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    holder: Mapped[str | None] = mapped_column(Str(255))


class Save(Base):
    """A checkpoint sealed at save (or right after it, on every rank): what the seal cost. Not a
    drill — nothing was restored — but the evidence that every checkpoint of a run was sealed
    where it was written, and at what price."""

    __tablename__ = "saves"
    __table_args__ = (UniqueConstraint("host", "pid", "saved_at", "checkpoint_uri", name="uq_saves_origin"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    checkpoint_uri: Mapped[str] = mapped_column(LongText, index=True)
    run_root: Mapped[str] = mapped_column(LongText, index=True)
    step: Mapped[int | None] = mapped_column(Integer)
    method: Mapped[str] = mapped_column(Str(16))
    """``writer`` (hashed as written: SealingWriter) or ``after-save`` (every rank re-read its share)."""
    files: Mapped[int] = mapped_column(Integer)
    bytes: Mapped[int] = mapped_column(BigInteger)
    hash_seconds: Mapped[float] = mapped_column(Float)
    save_seconds: Mapped[float] = mapped_column(Float)
    bytes_read_back: Mapped[int] = mapped_column(BigInteger)
    keyed: Mapped[bool] = mapped_column(Boolean)
    host: Mapped[str] = mapped_column(Str(255))
    pid: Mapped[int] = mapped_column(Integer)
    saved_at: Mapped[datetime] = mapped_column(UTCDateTime)
    drill_version: Mapped[str] = mapped_column(Str(64))


class Burst(Base):
    """A restore burst (``drill burst``): N readers restoring one checkpoint at once, swept over
    N, with the storage's ceiling. Not a drill — nothing was checked — but R's evidence."""

    __tablename__ = "bursts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_root: Mapped[str] = mapped_column(LongText, index=True)
    checkpoint_uri: Mapped[str] = mapped_column(LongText)
    started_at: Mapped[datetime] = mapped_column(index=True)
    host: Mapped[str] = mapped_column(Str(255))
    bytes: Mapped[int] = mapped_column(BigInteger)
    cold: Mapped[bool] = mapped_column(Boolean)
    replicated: Mapped[bool] = mapped_column(Boolean)
    max_readers: Mapped[int] = mapped_column(Integer)
    ceiling_bps: Mapped[float | None] = mapped_column(Float)
    ceiling_readers: Mapped[int | None] = mapped_column(Integer)
    document: Mapped[dict[str, Any]]
    drill_version: Mapped[str] = mapped_column(Str(64))


class AuditEntry(Base):
    """One link of the tamper-evident drill log (see :mod:`drill.records.audit`).

    No foreign key on purpose: an entry outlives a deleted drill row, which is how the
    deletion is found."""

    __tablename__ = "audit_log"
    __table_args__ = (UniqueConstraint("hash", name="uq_audit_log_hash"),)

    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    drill_id: Mapped[int] = mapped_column(Integer, index=True)
    content_sha256: Mapped[str] = mapped_column(Str(64))
    """SHA-256 of the drill's record as closed: its row, checks, replayed steps, checkpoint URI."""
    prev_hash: Mapped[str] = mapped_column(Str(64))
    hash: Mapped[str] = mapped_column(Str(64))
    mac: Mapped[str | None] = mapped_column(Str(64))
    """HMAC-SHA256 of the same message, when an audit key was configured."""
    key_id: Mapped[str | None] = mapped_column(Str(16))
    sealed_at: Mapped[datetime]
    closed_by: Mapped[str | None] = mapped_column(Str(32))
    """Who closed the record (``drill``, ``spool``, ``parent``, ``error-close``, ``orphan-recovery``);
    NULL on entries written before drill 0.5."""
    supersedes: Mapped[int | None] = mapped_column(BigInteger)
    """The seq of this record's previous entry, when it had one (a guess being corrected)."""
    version: Mapped[int | None] = mapped_column(SmallInteger)
    """How the record's content was digested: 3 (:mod:`drill.records.content`); NULL on the
    entries of drill 0.5 and earlier (``drill-audit/1`` and ``/2``: canonical JSON)."""


class AuditVerified(Base):
    """One pass of ``drill audit verify`` over the whole log: the head it reached, when, and
    whether it found the log intact — what ``drill metrics`` reports without verifying on a
    scrape. With an audit key, each row carries an HMAC under it; one without is not trusted."""

    __tablename__ = "audit_verified"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger)
    hash: Mapped[str] = mapped_column(Str(64))
    drill_id: Mapped[int] = mapped_column(Integer)
    sealed_at: Mapped[datetime]
    drills_through: Mapped[int] = mapped_column(Integer)
    verified_at: Mapped[datetime]
    full: Mapped[bool] = mapped_column(Boolean)
    mac: Mapped[str | None] = mapped_column(Str(64))
    intact: Mapped[bool] = mapped_column(Boolean, default=True)
    problems: Mapped[int] = mapped_column(Integer, default=0)
