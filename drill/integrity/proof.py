"""The one proof of a checkpoint's bytes, shared by ``drill run``, ``drill verify`` and
``drill.sdk.load``/``verified``.

    plan (listing, manifests, what to hash) → read (by the restore, or here) → compare with the
    seal → the format's structural proof → the coverage ledger

Each caller reads the bytes its own way — ``run`` while restoring, the SDK while loading into
the trainer's objects (each rank its own files), ``verify`` only hashing — and hands what it
read (``observed``) to :func:`prove`, which compares, judges and records coverage the same way
for all three. What the verdict of the whole is stays :mod:`drill.verdict`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drill.findings import CheckResult
from drill.integrity.coverage import CoverageUpdate, annotate_coverage, coverage_update
from drill.integrity.verify import IntegrityPlan, Observed, hash_remaining, integrity_check
from drill.storage import Storage

Ledger = Callable[[CoverageUpdate], "float | None"]
"""What records a proof in the coverage ledger and returns the share of the checkpoint's bytes
proven within the window (None when it is not known)."""


def prove(
    storage: Storage,
    plan: IntegrityPlan,
    observed: dict[str, Observed],
    *,
    structure: Any = None,
    require_sealed: bool = False,
    read_rest: bool = True,
    ledger: Ledger | None = None,
    coverage_days: float = 7.0,
) -> CheckResult:
    """The ``integrity`` check of a checkpoint from what was read (``observed``: path → its
    digests or error). With ``read_rest``, the files the plan selects that nobody read are
    hashed here (files no loader needs; all of them for ``verify``); ``structure`` is the
    format's structural proof (:meth:`~drill.formats.base.Format.structure`); ``ledger``
    records what a seal proved."""
    if plan.refuse:
        return integrity_check(plan, {})
    if read_rest:
        hash_remaining(storage, plan, observed)
    result = integrity_check(plan, observed, require_sealed=require_sealed, structure=structure)
    if ledger is not None and plan.manifest is not None:
        annotate_coverage(result, ledger(coverage_update(plan, result)), coverage_days)
    return result


def observed_by(files: Any) -> dict[str, Observed]:
    """What a restore's :class:`~drill.restore.FileRead` records say was read."""
    return {
        f.relative_path: Observed(hashes=f.hashes, error=f.error)
        for f in files
        if f.hashes is not None or f.error is not None
    }


__all__ = ["Ledger", "observed_by", "prove"]
