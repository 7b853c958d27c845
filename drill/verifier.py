"""``drill verify``: prove a checkpoint's bytes without loading its tensors.

Sealed checkpoints are hashed against their manifest (in parallel, one read per file);
unsealed ones get the structural proof their format allows. Torch is imported only for an
unsealed DCP checkpoint, whose ``.metadata`` must be read to check it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from drill.discover import DCP_METADATA, step_of
from drill.errors import ExitCode, NothingToDrill
from drill.findings import CheckResult, CheckStatus, Finding, Severity
from drill.integrity.sampling import SampleSpec
from drill.integrity.structure import dcp_structure, safetensors_structure, sniff, zip_structure
from drill.integrity.verify import NAME, IntegrityPlan, Observed, hash_remaining, integrity_check, plan_integrity
from drill.storage import Storage, storage_for

if TYPE_CHECKING:  # SQLAlchemy is imported only when a ledger is asked for
    from drill.records.store import Records


@dataclass(slots=True, kw_only=True)
class VerifyOutcome:
    uri: str
    result: CheckResult
    seconds: float
    bytes_hashed: int

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.FAILED if self.result.status is CheckStatus.FAILED else ExitCode.PASSED


def _structure_of_dcp(storage: Storage, plan: IntegrityPlan) -> tuple[list[Finding], dict] | None:
    if DCP_METADATA not in plan.on_storage:
        return None
    from drill.safe_pickle import restricted_loads

    with storage.open(storage.child(plan.checkpoint, DCP_METADATA)) as f:
        data = f.read()
    try:
        metadata = restricted_loads(data)
    except Exception as exc:  # noqa: BLE001 - an unreadable index is the finding
        finding = Finding(
            check=NAME,
            code="metadata-unreadable",
            severity=Severity.ERROR,
            subject=DCP_METADATA,
            message=f"{DCP_METADATA} cannot be loaded safely ({type(exc).__name__}: {exc})",
        )
        return [finding], {}
    return dcp_structure(metadata.storage_data or {}, plan.on_storage)


def _verify_file(storage: Storage, uri: str) -> CheckResult:
    view = storage.map(uri)
    if view is None:
        with storage.open(uri) as f:
            view = memoryview(f.read())
    name = os.path.basename(uri)
    kind = sniff(view)
    if kind == "zip":
        findings, evidence = zip_structure(view, name)
    elif kind == "safetensors":
        findings, evidence = safetensors_structure(view, name)
    else:
        return CheckResult(
            name=NAME,
            summary=f"{name}: unknown file format; nothing could be proved",
            findings=[Finding(check=NAME, code="format-unknown", severity=Severity.ERROR, subject=name, message=f"{name} is neither a torch.save zip nor safetensors")],
        )
    evidence = {"evidence_level": "unsealed", "format": kind, "structure": evidence}
    ok = not any(f.severity is Severity.ERROR for f in findings)
    what = "every record's CRC-32 matches" if kind == "zip" else "header offsets tile the file"
    summary = f"unsealed {kind}: structurally consistent ({what}), no content hashes" if ok else f"unsealed {kind}: structurally inconsistent"
    return CheckResult(name=NAME, summary=summary, findings=findings, evidence=evidence)


def verify_checkpoint(
    uri: str,
    *,
    sample: SampleSpec | None = None,
    require_sealed: bool = False,
    records: Records | None = None,
    coverage_days: float = 7.0,
    storage: Storage | None = None,
) -> VerifyOutcome:
    """Verify the checkpoint directory (or single checkpoint file) at ``uri``."""
    storage = storage or storage_for(uri)
    sample = sample or SampleSpec("all")
    started = time.perf_counter()
    try:
        entry = storage.stat(uri)
    except FileNotFoundError:
        raise NothingToDrill(f"{uri} does not exist") from None
    if not entry.is_dir:
        result = _verify_file(storage, uri)
        return VerifyOutcome(uri=uri, result=result, seconds=time.perf_counter() - started, bytes_hashed=entry.size)

    checkpoint_id = None
    last: dict = {}
    if records is not None and sample.kind == "auto":
        checkpoint_id = _checkpoint_id(records, uri)
        last = {p: t for p, (t, _) in records.last_verified(checkpoint_id).items()}
    plan = plan_integrity(storage, uri, sample, last)
    if plan.refuse:
        return VerifyOutcome(uri=uri, result=integrity_check(plan, {}), seconds=time.perf_counter() - started, bytes_hashed=0)
    observed: dict[str, Observed] = {}
    hash_remaining(storage, plan, observed)
    structure = _structure_of_dcp(storage, plan) if plan.manifest is None else None
    result = integrity_check(plan, observed, require_sealed=require_sealed, structure=structure)
    if records is not None and plan.manifest is not None:
        from drill.coverage import update_coverage

        update_coverage(records, checkpoint_id or _checkpoint_id(records, uri), None, plan, result, coverage_days)
    hashed = sum(o.hashes.size for o in observed.values() if o.hashes is not None)
    result.seconds = time.perf_counter() - started
    return VerifyOutcome(uri=uri, result=result, seconds=result.seconds, bytes_hashed=hashed)


def _checkpoint_id(records: Records, uri: str) -> int:
    return records.ensure_checkpoint(
        run_root=os.path.dirname(uri.rstrip("/")), uri=uri, step=step_of(os.path.basename(uri.rstrip("/"))), format="dcp"
    )
