"""The ``integrity`` check: the bytes read against the checkpoint's manifests, or a structural
proof when it is unsealed (see :mod:`drill.integrity.verify`)."""

from __future__ import annotations

from drill import formats
from drill.checks import CheckInputs
from drill.findings import CheckResult
from drill.integrity.proof import observed_by, prove


def check_integrity(inputs: CheckInputs) -> CheckResult:
    plan, restore = inputs.plan, inputs.restore
    assert plan is not None
    if plan.refuse or restore is None:
        return prove(inputs.storage, plan, {}, read_rest=False)
    # The format's structural proof, held under a seal too: an independent witness (README: Integrity).
    structure = formats.get(restore.format).restored_structure(
        restore, inputs.storage, plan.checkpoint, plan.on_storage
    )
    return prove(
        inputs.storage, plan, observed_by(restore.files), structure=structure, require_sealed=inputs.require_sealed,
        ledger=inputs.ledger, coverage_days=inputs.coverage_days,
    )  # fmt: skip
