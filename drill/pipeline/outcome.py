"""What a drill found: :class:`DrillOutcome` and its one JSON document.

``drill run --json``, ``drill show --json``, the scheduler's child and the alerts all use
:meth:`DrillOutcome.to_document`; the record store rebuilds the same outcome from its rows
(:meth:`DrillOutcome.from_document`), so a drill reads the same whether it was just run or
looked up a year later.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from drill.claims import RecordSeal, proof_of
from drill.errors import ExitCode
from drill.findings import CheckResult, Finding, jsonable
from drill.verdict import DrillStatus

DOCUMENT_VERSION = 1
"""The shape of :meth:`DrillOutcome.to_document`, written in its ``version`` field (the schema is
``drill/schemas/outcome-v1.schema.json``). Raised when a field's meaning changes or one is
removed; documents without it were written by drill 0.5.0 and earlier, in this shape."""


class DocumentVersionError(ValueError):
    """A document (an outcome, a save) written by a newer drill, in a shape this one cannot read."""


def check_version(doc: dict[str, Any], known: int, what: str) -> None:
    """Raise :class:`DocumentVersionError` unless this drill reads ``doc``'s ``version`` (a
    document without one predates versions and has version 1's shape)."""
    version = doc.get("version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version > known:
        raise DocumentVersionError(
            f"{what} document version {version!r}: this drill reads version {known} and earlier (upgrade drill)"
        )


@dataclass(slots=True, kw_only=True)
class Timings:
    """Seconds per phase. ``restore`` is what a resume would pay — drill start until the state
    is on the device — and is discover + plan + read + load + other."""

    restore: float | None = None
    discover: float | None = None
    """Listing the run root and choosing the checkpoint."""
    plan: float | None = None
    """Listing the checkpoint and reading its manifests: deciding what to hash."""
    read: float | None = None
    """Waiting on storage for bytes not yet read (hashing rides along)."""
    load: float | None = None
    """Deserializing and copying onto the device."""
    checks: float | None = None
    replay: float | None = None
    ttfs: float | None = None
    """Time to first step: drill start until the first replayed step finished."""

    @property
    def other(self) -> float | None:
        """The part of ``restore`` outside the named phases: reading the checkpoint's index,
        allocating the targets, and drill's own bookkeeping."""
        if self.restore is None:
            return None
        named = sum(v or 0.0 for v in (self.discover, self.plan, self.read, self.load))
        return max(0.0, self.restore - named)

    def to_dict(self) -> dict[str, float | None]:
        names = ("restore", "discover", "plan", "read", "load", "checks", "replay", "ttfs")
        return {**{n: getattr(self, n) for n in names}, "other": self.other}


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointInfo:
    uri: str
    name: str
    step: int | None
    format: str
    bytes: int | None = None
    files: int | None = None


@dataclass(slots=True, kw_only=True)
class ReplaySummary:
    verdict: str
    """``passed``, ``diverged``, ``not replayable`` or ``error``."""
    reason: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    """Each replayed step: reference and replayed loss, grad norm, batch, whether it matched."""


@dataclass(slots=True, kw_only=True)
class DrillOutcome:
    id: int | None
    """The drill's record id; None when nothing was recorded (a null recorder)."""
    status: DrillStatus
    exit_code: ExitCode
    message: str | None
    """Why the drill did not pass, in one line (for stderr and alerts)."""
    run_root: str
    selector: str
    trigger: str
    host: str
    pid: int
    device: str
    started_at: datetime
    finished_at: datetime | None = None
    phase: str = "start"
    """The last phase reached: where an aborted or crashed drill stopped."""
    checkpoint: CheckpointInfo | None = None
    policy: str | None = None
    selection: str | None = None
    """How the checkpoint was chosen (with the seed of a random choice)."""
    timings: Timings = field(default_factory=Timings)
    bytes_read: int | None = None
    evidence_level: str | None = None
    """``sealed`` (content hashes) or ``unsealed`` (structural proof only)."""
    sample: str | None = None
    replay: ReplaySummary | None = None
    slo_breaches: dict[str, Any] = field(default_factory=dict)
    checks: list[CheckResult] = field(default_factory=list)
    error: str | None = None
    """drill's own failure in full (a traceback), or how a dead drill died."""
    versions: dict[str, str | None] = field(default_factory=dict)
    alerts: list[dict[str, Any]] = field(default_factory=list)
    distributed: dict[str, Any] | None = None
    """A drill run by many ranks: world size, per-rank files, bytes and seconds, the byte
    balance, the slowest rank and why (see :func:`drill.dist.restore.figures`)."""
    page_cache: dict[str, Any] | None = None
    """Where the restore read from: ``{"cold": bool, "bytes", "resident", "how"}`` — the bytes
    of the checkpoint this host held cached when the restore began (after the drop, for a cold
    drill; None for object storage, which caches nothing here)."""
    job_id: str | None = None
    """The batch job that ran the drill (``slurm:1234``), when ``drill submit`` launched it."""
    options: dict[str, Any] = field(default_factory=dict)
    """How the drill was asked for (:meth:`~drill.pipeline.request.DrillRequest.options`): the
    flags that repeat it, its policy file, the parts it accepted as missing."""
    record_problem: str | None = None
    """Set when the record could not be written in full (never part of the stored document)."""
    seal: RecordSeal | None = None
    """How the record, as read back from the database, stands against its audit log entry
    (:func:`drill.records.audit.attest`); None for an outcome not read from the records."""

    @property
    def findings(self) -> list[Finding]:
        return [f for c in self.checks for f in c.findings]

    @property
    def throughput_bps(self) -> float | None:
        if self.distributed and self.distributed.get("slowest", {}).get("seconds"):
            return self.distributed["bytes_total"] / self.distributed["slowest"]["seconds"]  # all ranks together
        busy = (self.timings.read or 0.0) + (self.timings.load or 0.0)
        return self.bytes_read / busy if self.bytes_read and busy > 0 else None

    def check(self, name: str) -> CheckResult | None:
        return next((c for c in self.checks if c.name == name), None)

    def to_document(self, *, with_checks: bool = True) -> dict[str, Any]:
        """The drill as one JSON document (``drill run --json``, ``drill show --json``)."""
        ck = self.checkpoint
        doc: dict[str, Any] = {
            "version": DOCUMENT_VERSION,
            "id": self.id,
            "status": self.status.value,
            "exit_code": int(self.exit_code),
            "message": self.message,
            "run_root": self.run_root,
            "selector": self.selector,
            "trigger": self.trigger,
            "policy": self.policy,
            "selection": self.selection,
            "checkpoint": None
            if ck is None
            else {k: getattr(ck, k) for k in ("uri", "name", "step", "format", "bytes", "files")},
            "host": self.host,
            "pid": self.pid,
            "device": self.device,
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "phase": self.phase,
            "timings": self.timings.to_dict(),
            "bytes_read": self.bytes_read,
            "throughput_bps": self.throughput_bps,
            "evidence_level": self.evidence_level,
            "sample": self.sample,
            "replay": None if self.replay is None else {"verdict": self.replay.verdict, "reason": self.replay.reason},
            "slo_breaches": self.slo_breaches,
            "error": self.error,
            "versions": self.versions,
            "alerts": self.alerts,
            "distributed": self.distributed,
            "page_cache": self.page_cache,
            "job_id": self.job_id,
            "options": self.options,
            "proof": proof_of(self).to_dict(),
        }
        if self.seal is not None:
            doc["seal"] = self.seal.to_dict()
        if with_checks:
            doc["checks"] = [c.to_dict() for c in self.checks]
            if doc["replay"] is not None:
                doc["replay"]["steps"] = self.replay.steps  # type: ignore[union-attr]
        return jsonable(doc)

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> DrillOutcome:
        """The outcome a document describes; :class:`DocumentVersionError` for a document of a
        newer version (a spool written by a newer drill, read by an older one)."""
        check_version(doc, DOCUMENT_VERSION, "outcome")
        ck = doc.get("checkpoint")
        replay = doc.get("replay")
        return cls(
            id=doc["id"],
            status=DrillStatus(doc["status"]),
            exit_code=ExitCode(doc["exit_code"]),
            message=doc.get("message"),
            run_root=doc["run_root"],
            selector=doc["selector"],
            trigger=doc["trigger"],
            host=doc["host"],
            pid=doc["pid"],
            device=doc["device"],
            started_at=datetime.fromisoformat(doc["started_at"]),
            finished_at=datetime.fromisoformat(doc["finished_at"]) if doc.get("finished_at") else None,
            phase=doc.get("phase") or "start",
            checkpoint=CheckpointInfo(**ck) if ck else None,
            policy=doc.get("policy"),
            selection=doc.get("selection"),
            timings=Timings(**{k: v for k, v in (doc.get("timings") or {}).items() if k != "other"}),
            bytes_read=doc.get("bytes_read"),
            evidence_level=doc.get("evidence_level"),
            sample=doc.get("sample"),
            replay=ReplaySummary(verdict=replay["verdict"], reason=replay["reason"], steps=replay.get("steps", []))
            if replay
            else None,
            slo_breaches=dict(doc.get("slo_breaches") or {}),
            checks=[CheckResult.from_dict(c) for c in doc.get("checks", [])],
            error=doc.get("error"),
            versions=dict(doc.get("versions") or {}),
            alerts=list(doc.get("alerts") or []),
            distributed=doc.get("distributed"),
            page_cache=doc.get("page_cache"),
            job_id=doc.get("job_id"),
            options=dict(doc.get("options") or {}),
        )
