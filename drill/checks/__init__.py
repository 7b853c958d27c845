"""Checks: each takes what a restore produced and returns a :class:`CheckResult`.

They run in the order listed, in stages as pg_verifybackup does — were the files there and
readable, did the state load, is the state what a resume needs — each saying what it proved.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from drill import parts
from drill.checks.files import check_files
from drill.checks.keys import check_keys
from drill.checks.load import check_load
from drill.findings import CheckResult
from drill.restore import RestoreResult


@dataclass(frozen=True, slots=True, kw_only=True)
class Expectations:
    """What a checkpoint must hold to count as resumable; policies tighten or relax it."""

    required_parts: tuple[str, ...] = parts.CANONICAL_PARTS
    """Parts whose absence fails the drill. The default is everything a bitwise resume needs."""


Check = Callable[[RestoreResult, Expectations], CheckResult]

CHECKS: tuple[Check, ...] = (check_files, check_load, check_keys)


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
