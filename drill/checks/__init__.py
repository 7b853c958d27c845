"""Checks: each judges what a drill found and returns a :class:`~drill.findings.CheckResult`.

Every check has one signature, ``(CheckInputs) -> CheckResult``, and one place in
:data:`drill.checks.registry.CHECKS`, which fixes their order — in stages, as pg_verifybackup
does: what is retained and what a resume would pick, are the bytes the bytes that were
written, were the files there and readable, did the state load, is it the state a resume
needs, and does a resume from it continue the original run. A check never prints and never
does I/O of its own beyond what its inputs name (the integrity check hashes files the
restore did not need).

This module is cheap to import (no torch): the registry imports the checks themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from drill import parts

if TYPE_CHECKING:
    from drill.checkpoints import CheckpointRef, Discovery
    from drill.formats.canonical import Layout
    from drill.integrity.verify import IntegrityPlan
    from drill.replay.run import ReplayOutcome
    from drill.restore import RestoreResult
    from drill.storage import Storage


@dataclass(frozen=True, slots=True, kw_only=True)
class Expectations:
    """What a checkpoint must hold to count as resumable; policies tighten or relax it."""

    required_parts: tuple[str, ...] | None = None
    """Parts whose absence fails the drill. None: what the checkpoint's framework needs to
    resume (all six canonical parts for DCP; see each format's layout)."""
    allow_missing: tuple[str, ...] = ()
    """Parts whose absence is accepted (reported as info), e.g. ``rng`` for a run without dropout."""
    finite_scan: str = "full"
    """``full`` (every element), ``sampled`` (≤ 64 Ki elements per tensor) or ``off``."""

    def __post_init__(self) -> None:
        unknown = [p for p in (*(self.required_parts or ()), *self.allow_missing) if p not in parts.CANONICAL_PARTS]
        if unknown:
            raise ValueError(f"unknown part(s) {', '.join(unknown)}: expected {', '.join(parts.CANONICAL_PARTS)}")
        if self.finite_scan not in FINITE_SCANS:
            raise ValueError(f"finite scan must be {', '.join(FINITE_SCANS)}, not {self.finite_scan!r}")

    def parts_required(self, layout: Layout | None) -> tuple[str, ...]:
        base = (
            self.required_parts
            if self.required_parts is not None
            else (layout.required if layout else parts.CANONICAL_PARTS)
        )
        return tuple(p for p in base if p not in self.allow_missing)

    def parts_recommended(self, layout: Layout | None) -> tuple[str, ...]:
        required = self.parts_required(layout)
        rec = layout.recommended if layout else ()
        return tuple(p for p in rec if p not in required and p not in self.allow_missing)


FINITE_SCANS = ("full", "sampled", "off")


@dataclass(slots=True, kw_only=True)
class CheckInputs:
    """Everything a check may look at; a stage fills in what it produced."""

    storage: Storage
    root: str
    expectations: Expectations = field(default_factory=Expectations)
    require_sealed: bool = False
    discovery: Discovery | None = None
    nothing_to_drill: Any = None
    """The :class:`~drill.errors.NothingToDrill` discovery or selection raised, if any."""
    ref: CheckpointRef | None = None
    selection: str | None = None
    """How the checkpoint was chosen."""
    plan: IntegrityPlan | None = None
    restore: RestoreResult | None = None
    replay: ReplayOutcome | None = None
    durable: str | None = None
    """The run root's copy on a durable tier, when one is to be verified."""
    storage_options: dict[str, Any] = field(default_factory=dict)
    ledger: Any = None
    """Where the integrity check records what a seal proved (:data:`drill.integrity.proof.Ledger`)."""
    coverage_days: float = 7.0


__all__ = ["CheckInputs", "Expectations", "FINITE_SCANS"]
