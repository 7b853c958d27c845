"""The ``integrity`` check: the bytes read against the checkpoint's manifests, or a structural
proof when it is unsealed (see :mod:`drill.integrity.verify`)."""

from __future__ import annotations

from drill.checks import CheckInputs
from drill.findings import CheckResult
from drill.integrity.verify import Observed, hash_remaining, integrity_check


def check_integrity(inputs: CheckInputs) -> CheckResult:
    plan, restore = inputs.plan, inputs.restore
    assert plan is not None
    if plan.refuse or restore is None:
        return integrity_check(plan, {})
    observed = {
        f.relative_path: Observed(hashes=f.hashes, error=f.error)
        for f in restore.files
        if f.hashes is not None or f.error is not None
    }
    hash_remaining(inputs.storage, plan, observed)  # files no loader needed, hashed all the same
    structure = restore.structure  # held under a seal too: an independent witness (README: Integrity)
    if structure is None and restore.format == "dcp" and ".metadata" in plan.on_storage:
        if restore.index is not None or restore.metadata_error is not None:
            from drill.formats.dcp_layout import unsealed_structure

            why = (restore.metadata_error or "").removeprefix(".metadata: ")
            structure = unsealed_structure(inputs.storage, plan.checkpoint, plan.on_storage, restore.index, why)
    return integrity_check(plan, observed, require_sealed=inputs.require_sealed, structure=structure)
