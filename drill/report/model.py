"""What an audit report holds: plain dataclasses, one ``to_dict`` — the JSON format — and
nothing about rendering. The renderers (:mod:`drill.report.html`, :mod:`drill.report.markdown`)
read these and nothing else.

The JSON document is ``{"schema": "drill.report/1", ...}``; fields are only ever added
within a schema version (README: "Report JSON").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from drill.claims import Coverage, Proof
from drill.goodput import GoodputRow, MeasuredRestart
from drill.stats import Summary

SCHEMA = "drill.report/1"


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t is not None else None


@dataclass(slots=True)
class CheckpointRow:
    """One checkpoint of a run: is it proven restorable, and on what evidence?"""

    uri: str
    name: str
    step: int | None
    format: str | None
    bytes: int | None
    retained: bool | None
    """Still on storage (None: storage could not be listed from this host)."""
    bytes_on_storage: int | None = None
    """What it occupies on storage now (None: not listed)."""
    last_drill_id: int | None = None
    last_status: str | None = None
    last_drilled_at: datetime | None = None
    proof: Proof | None = None
    """What its latest drill proved: evidence level, replay verdict, parts accepted as missing."""
    proven: bool = False
    """Proven restorable: its latest drill passed on at least structural evidence
    (:func:`drill.claims.good_enough`)."""
    bytes_verified: int = 0
    """Bytes whose sealed digest matched, by the latest verification of each file (any age)."""
    bytes_verified_in_window: int = 0
    verified_at: datetime | None = None
    drills_in_window: int = 0
    sealed_at_save: dict[str, Any] | None = None
    """The recorded save that sealed it (method, bytes, hashing seconds, save seconds, keyed), if any."""

    @property
    def evidence_level(self) -> str | None:
        return self.proof.evidence if self.proof else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "uri": self.uri, "name": self.name, "step": self.step, "format": self.format, "bytes": self.bytes,
            "bytes_on_storage": self.bytes_on_storage, "retained": self.retained, "proven_restorable": self.proven,
            "last_drill_id": self.last_drill_id, "last_status": self.last_status, "last_drilled_at": _iso(self.last_drilled_at),
            "evidence_level": self.evidence_level, "proof": self.proof.to_dict() if self.proof else None,
            "bytes_verified": self.bytes_verified, "bytes_verified_in_window": self.bytes_verified_in_window,
            "verified_at": _iso(self.verified_at), "drills_in_window": self.drills_in_window, "sealed_at_save": self.sealed_at_save,
        }  # fmt: skip


@dataclass(slots=True)
class DrillEntry:
    """One drill as a report shows it: verdict, latency and the evidence behind the verdict."""

    id: int | None
    started_at: datetime
    status: str
    exit_code: int
    message: str | None
    checkpoint: str | None
    step: int | None
    trigger: str
    policy: str | None
    device: str
    evidence_level: str | None
    sample: str | None
    restore_s: float | None
    ttfs_s: float | None
    bytes_read: int | None
    throughput_bps: float | None
    checks: list[dict[str, Any]]
    """name, status, summary of each check."""
    integrity: dict[str, Any]
    """summary, manifests, bytes_verified, bytes_listed, authenticated."""
    replay: dict[str, Any] | None
    """verdict, reason, steps (reference vs replayed loss, grad norm and batch)."""
    findings: list[dict[str, Any]]
    """Every error and warning finding, with its hint."""
    slo_breaches: list[str]
    rerun: str
    """The exact command that drills this checkpoint again."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "started_at": _iso(self.started_at), "status": self.status, "exit_code": self.exit_code,
            "message": self.message, "checkpoint": self.checkpoint, "step": self.step, "trigger": self.trigger,
            "policy": self.policy, "device": self.device, "evidence_level": self.evidence_level, "sample": self.sample,
            "restore_seconds": self.restore_s, "ttfs_seconds": self.ttfs_s, "bytes_read": self.bytes_read,
            "throughput_bps": self.throughput_bps, "checks": self.checks, "integrity": self.integrity, "replay": self.replay,
            "findings": self.findings, "slo_breaches": self.slo_breaches, "rerun": self.rerun,
        }  # fmt: skip


@dataclass(slots=True)
class GoodputSection:
    """What the run's measured restore time costs at scale."""

    restart: MeasuredRestart
    blocking_s: float
    rows: list[GoodputRow]

    def to_dict(self) -> dict[str, Any]:
        r = self.restart
        return {
            "restart_s": r.restart_s, "drills": r.drills, "p95_ttfs_s": r.p95_ttfs_s, "how": r.how,
            "blocking_s": self.blocking_s, "rows": [row.to_dict() for row in self.rows],
        }  # fmt: skip


@dataclass(slots=True)
class RunSection:
    run_root: str
    policies: list[str]
    retention: str
    """Where the retained set came from: ``storage`` (listed now) or ``records`` (as drills saw it)."""
    retention_note: str | None
    checkpoints: list[CheckpointRow]
    coverage: Coverage
    counts: dict[str, int]
    restore: Summary
    ttfs: Summary
    throughput: Summary
    drills: list[DrillEntry]
    """The drills listed in full, oldest first: every drill of the window, or past
    :attr:`ReportOptions.listed <drill.report.build.ReportOptions.listed>` the newest and the
    failures among them (:attr:`drills_in_window` counts them all)."""
    drills_in_window: int = 0
    """Every drill started in the window (what counts and percentiles cover)."""
    goodput: GoodputSection | None = None
    burst: dict[str, Any] | None = None
    """The run's latest restore burst (``drill burst``'s document), if any."""

    @property
    def listing(self) -> str:
        """What the drill list holds: every drill of the window, or which of them."""
        if len(self.drills) >= self.drills_in_window:
            return "Every drill in the window"
        return (
            f"{len(self.drills)} of the {self.drills_in_window} drills in the window: the newest, and the failures among the newest "
            f"(counts, percentiles and coverage cover all {self.drills_in_window}; --drills all lists every one)"
        )

    @property
    def slo_breaches(self) -> list[DrillEntry]:
        return [d for d in self.drills if d.slo_breaches]

    @property
    def proven(self) -> int:
        """Retained checkpoints proven restorable (their latest drill passed on structural evidence or better)."""
        return sum(1 for c in self.checkpoints if c.proven and c.retained is not False)

    @property
    def last(self) -> DrillEntry | None:
        return self.drills[-1] if self.drills else None

    @property
    def needs_attention(self) -> bool:
        """What an auditor reads first: a failure in the window, a retained checkpoint not
        proven, or no drill at all in the window."""
        failed = any(status not in ("passed", "running") for status in self.counts)
        return failed or self.proven < self.coverage.retained or not self.drills_in_window

    @property
    def failures(self) -> list[DrillEntry]:
        return [d for d in self.drills if d.status not in ("passed", "running")]

    def to_dict(self) -> dict[str, Any]:
        return {
            "burst": self.burst,
            "run_root": self.run_root, "policies": self.policies, "retention": self.retention, "retention_note": self.retention_note,
            "checkpoints": [c.to_dict() for c in self.checkpoints], "coverage": self.coverage.to_dict(), "counts": self.counts,
            "restore_seconds": self.restore.to_dict(), "ttfs_seconds": self.ttfs.to_dict(), "throughput_bps": self.throughput.to_dict(),
            "slo_breaches": [{"drill_id": d.id, "started_at": _iso(d.started_at), "breaches": d.slo_breaches} for d in self.slo_breaches],
            "drills_in_window": self.drills_in_window, "drills_listed": len(self.drills),
            "drills": [d.to_dict() for d in self.drills], "goodput": self.goodput.to_dict() if self.goodput else None,
        }  # fmt: skip


@dataclass(slots=True)
class Report:
    generated_at: datetime
    since: datetime | None
    until: datetime
    policy: str | None
    root: str | None
    database: str
    chain: dict[str, Any]
    """``drill audit verify``'s result: intact, entries, head (pin it), problems."""
    runs: list[RunSection] = field(default_factory=list)

    @property
    def drills(self) -> int:
        return sum(r.drills_in_window for r in self.runs)

    def counts(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for r in self.runs:
            for status, n in r.counts.items():
                total[status] = total.get(status, 0) + n
        return total

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "generated_at": _iso(self.generated_at), "since": _iso(self.since), "until": _iso(self.until),
            "filters": {"policy": self.policy, "root": self.root}, "database": self.database, "chain": self.chain,
            "totals": {"drills": self.drills, "runs": len(self.runs), "by_status": self.counts(),
                       "checkpoints_proven": sum(1 for r in self.runs for c in r.checkpoints if c.proven and c.retained is not False)},
            "runs": [r.to_dict() for r in self.runs],
        }  # fmt: skip


__all__ = ["SCHEMA", "CheckpointRow", "DrillEntry", "GoodputSection", "Report", "RunSection"]
