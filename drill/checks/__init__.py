"""Checks: each takes what a restore produced and returns a :class:`CheckResult`.

They run in the order listed, in stages as pg_verifybackup does — were the files there and
readable, did the state load, is the state what a resume needs — each saying what it proved.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from drill import parts
from drill.checks.contract import check_contract
from drill.checks.files import check_files
from drill.checks.keys import check_keys
from drill.checks.load import check_load
from drill.findings import CheckResult
from drill.formats.canonical import Layout
from drill.restore import RestoreResult


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
        if self.finite_scan not in ("full", "sampled", "off"):
            raise ValueError(f"finite_scan must be full, sampled or off, not {self.finite_scan!r}")

    def parts_required(self, layout: Layout | None) -> tuple[str, ...]:
        base = self.required_parts if self.required_parts is not None else (layout.required if layout else parts.CANONICAL_PARTS)
        return tuple(p for p in base if p not in self.allow_missing)

    def parts_recommended(self, layout: Layout | None) -> tuple[str, ...]:
        required = self.parts_required(layout)
        rec = layout.recommended if layout else ()
        return tuple(p for p in rec if p not in required and p not in self.allow_missing)


Check = Callable[[RestoreResult, Expectations], CheckResult]

CHECKS: tuple[Check, ...] = (check_files, check_load, check_keys, check_contract)


def run_checks(restore: RestoreResult, expectations: Expectations | None = None) -> list[CheckResult]:
    expectations = expectations or Expectations()
    results = []
    for check in CHECKS:
        started = time.perf_counter()
        result = check(restore, expectations)
        result.seconds = time.perf_counter() - started
        results.append(result)
    return results


__all__ = ["CHECKS", "Expectations", "run_checks"]
