"""The coverage ledger after a verification: which bytes are proven, and how recently."""

from __future__ import annotations

from drill.findings import CheckResult, Severity
from drill.integrity.verify import IntegrityPlan
from drill.records.store import Records


def update_coverage(
    records: Records, checkpoint_id: int, drill_id: int | None, plan: IntegrityPlan, integrity: CheckResult, days: float
) -> None:
    """Record files that matched their seal, forget files that no longer do, and add the
    checkpoint's coverage ("% of bytes verified within the last D days") to the result."""
    assert plan.manifest is not None
    sealed = {f.path: (f.size, f.xxh3_128) for f in plan.manifest.files}
    records.record_verified(checkpoint_id, drill_id, {p: sealed[p] for p in integrity.evidence.get("verified", [])})
    broken = {f.subject for f in integrity.findings if f.severity is Severity.ERROR and f.subject in sealed}
    records.forget_verified(checkpoint_id, broken)
    share = records.coverage(checkpoint_id, sealed, days)
    integrity.evidence["coverage"] = {"days": days, "percent": round(100 * share, 1)}
    integrity.summary += f"; {100 * share:.0f}% of this checkpoint's bytes verified within the last {days:g} days"
