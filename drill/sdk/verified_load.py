"""The machinery behind :func:`drill.sdk.load`: the read, the comparison with the seal, the
agreement between ranks, the drill record and the fallback. Imported on first use, so a
training script that imports ``drill.sdk`` pays for none of it until it resumes."""

from __future__ import annotations

import os
import socket
import time
from datetime import datetime, timezone
from typing import Any

import torch
import torch.distributed as dist

from drill import formats
from drill.checks import CheckInputs
from drill.checks.files import check_files
from drill.checks.load import check_load
from drill.claims import DEFAULT_MIN_EVIDENCE, evidence_of
from drill.errors import StorageProblem
from drill.findings import CheckResult, Finding, Severity, not_run
from drill.formats.base import RestoreContext, one_line
from drill.formats.dcp_names import DCP_METADATA
from drill.formats.dcp_read import MetadataUnreadable
from drill.formats.dcp_reader import DCPStorageReader, SafeLoadPlanner, dcp_load
from drill.integrity.hashing import HashPlan
from drill.integrity.proof import observed_by, prove
from drill.integrity.sampling import SampleSpec
from drill.integrity.verify import IntegrityPlan, plan_integrity
from drill.memory import collector_paused
from drill.restore import RestoreResult
from drill.sdk.report import TRIGGER, CheckpointCorrupt, LoadReport
from drill.storage import storage_for
from drill.verdict import DrillStatus, decide


def run_load(
    state: dict[str, Any],
    checkpoint_id: str,
    verify: bool,
    process_group: Any,
    planner: Any,
    key: bytes | None,
    allow_classes: tuple[str, ...],
) -> tuple[LoadReport, list[CheckResult], RestoreResult]:
    """Load, then prove what this rank read as ``drill run`` does (:func:`~drill.integrity.proof.prove`,
    the ``files`` and ``load`` checks); every rank gets every rank's findings.

    Python's cyclic collector is paused throughout (:func:`~drill.memory.collector_paused`):
    an index of 20,000 entries, DCP's plan of as many reads and the proof of as many files are
    each tens of thousands of small objects, and every collection they set off walks all that
    the trainer and torch hold — ten times the unpickling of the index itself."""
    with collector_paused():
        storage = storage_for(str(checkpoint_id))
        uri = storage.normalize(str(checkpoint_id))
        started = time.perf_counter()
        plan = plan_integrity(storage, uri, SampleSpec("all"), key=key) if verify else None
        sealed = plan is not None and plan.manifest is not None
        report = LoadReport(checkpoint=uri, sealed=sealed)
        report.seconds["plan"] = time.perf_counter() - started
        result = RestoreResult(uri=uri, format=_DCP.name, device="cpu", index_file=DCP_METADATA)
        hash_plan = HashPlan(chunk_size=plan.hash_plan.chunk_size) if sealed else HashPlan(files=frozenset())  # type: ignore[union-attr]
        reader = DCPStorageReader(
            storage,
            uri,
            result,
            RestoreContext(device=torch.device("cpu"), hash_plan=hash_plan, allow_classes=allow_classes),
        )
        refused = plan is not None and plan.refuse
        not_loaded = None if refused else _read(state, reader, result, planner, process_group)
        report.seconds["read"], report.seconds["load"] = result.read_seconds, result.load_seconds
        checked = time.perf_counter()
        checks = _checks(storage, plan, result, not_loaded)
        report.seconds["verify"] = time.perf_counter() - checked
        checks, report.ranks, report.bytes_read = _agree(checks, result.bytes_read, process_group)
        integrity = checks[0] if checks[0].name == "integrity" else None
        report.evidence = evidence_of(integrity) if integrity is not None else "none"
        report.verified_files = int(integrity.evidence.get("files_verified", 0)) if integrity is not None else 0
        report.byte_ranges = {
            p: [tuple(r) for r in rs]
            for p, rs in (integrity.evidence.get("damaged_ranges", {}) if integrity else {}).items()
        }
        return report, checks, result


_DCP = formats.get("dcp")


def _read(
    state: dict[str, Any], reader: DCPStorageReader, result: RestoreResult, planner: Any, process_group: Any
) -> str | None:
    """``dcp.load`` through drill's reader; why it did not load, when it did not."""
    distributed = dist.is_available() and dist.is_initialized()
    try:
        dcp_load(state, reader, planner or SafeLoadPlanner(result.failures), process_group, distributed)
    except Exception as exc:  # noqa: BLE001 - DCP wraps every rank's failure; it is the finding
        unreadable = _cause(exc, MetadataUnreadable)
        if unreadable is not None:
            result.metadata_error = str(unreadable)
            return None  # the load check names the index
        return one_line(exc)
    finally:
        result.index = reader.storage_data or None
    return None


def _cause(exc: BaseException | None, kind: type[BaseException]) -> BaseException | None:
    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, kind):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def _checks(
    storage: Any, plan: IntegrityPlan | None, result: RestoreResult, not_loaded: str | None
) -> list[CheckResult]:
    """The ``integrity``, ``files`` and ``load`` checks of this rank's read: the same checks
    (and the same structural proof) ``drill run`` gives the same checkpoint."""
    checks: list[CheckResult] = []
    if plan is not None:
        structure = None if plan.refuse else _DCP.restored_structure(result, storage, plan.checkpoint, plan.on_storage)
        checks.append(prove(storage, plan, observed_by(result.files), structure=structure, read_rest=False))
        if plan.refuse:
            return checks + [
                not_run(n, "a path leads out of the checkpoint: nothing was opened") for n in ("files", "load")
            ]
    inputs = CheckInputs(storage=storage, root=result.uri, plan=plan, restore=result)
    files, load = check_files(inputs), check_load(inputs)
    if not_loaded is not None:
        load.findings.append(
            Finding(
                check="load",
                code="checkpoint-not-loaded",
                severity=Severity.ERROR,
                subject=result.uri,
                message=f"the checkpoint did not load: {not_loaded}",
            )
        )
        load.summary = "the checkpoint did not load into the trainer's objects"
    for check in checks + [files, load]:
        check.evidence["trigger"] = TRIGGER
    return checks + [files, load]


def _agree(checks: list[CheckResult], nbytes: int, process_group: Any) -> tuple[list[CheckResult], int, int]:
    """Every rank's findings on every rank: all raise, or none does (one rank training on while
    another falls back would hang the job)."""
    if not (dist.is_available() and dist.is_initialized()):
        return checks, 1, nbytes
    world = dist.get_world_size(process_group)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (checks, nbytes), group=process_group)
    merged = []
    for mine, *theirs in zip(checks, *(g[0] for g in gathered), strict=False):
        findings = list(mine.findings)
        for other in theirs:
            findings += [f for f in other.findings if f not in findings]
            for path, ranges in other.evidence.get("damaged_ranges", {}).items():
                mine.evidence.setdefault("damaged_ranges", {})[path] = ranges
        if len(findings) > len(mine.findings):
            mine.summary = f"{len(findings) - len(mine.findings)} problem(s) found by other ranks; {mine.summary}"
        mine.findings, mine.errored = findings, any(c.errored for c in (mine, *theirs))
        merged.append(mine)
    return merged, world, sum(n for _, n in gathered)


# -- the record --------------------------------------------------------------------------------
def outcome_of(report: LoadReport, checks: list[CheckResult], files: int, began: datetime) -> Any:
    """The resume as a drill outcome: its checks, judged by :func:`drill.verdict.decide` as
    every drill is, and latency per phase."""
    from drill import __version__
    from drill.checkpoints import step_of
    from drill.pipeline.outcome import CheckpointInfo, DrillOutcome, Timings

    name = report.checkpoint.rstrip("/").rsplit("/", 1)[-1]
    verdict = decide(checks)
    return DrillOutcome(
        id=None,
        status=verdict.status,
        exit_code=verdict.exit_code,
        message=verdict.message,
        run_root=report.checkpoint.rstrip("/").rsplit("/", 1)[0] or "/",
        selector=name,
        trigger=TRIGGER,
        host=socket.gethostname(),
        pid=os.getpid(),
        device="cpu",
        started_at=began,
        finished_at=datetime.now(timezone.utc),
        phase="record",
        checkpoint=CheckpointInfo(
            uri=report.checkpoint,
            name=name,
            step=step_of(name),
            format=report.format,
            bytes=report.bytes_read,
            files=files,
        ),
        selection="resume",
        timings=Timings(
            restore=report.seconds.get("total"),
            plan=report.seconds.get("plan"),
            read=report.seconds.get("read"),
            load=report.seconds.get("load"),
        ),
        bytes_read=report.bytes_read,
        evidence_level=report.evidence,
        checks=checks,
        versions={"drill": __version__, "torch": torch.__version__},
        distributed={"world_size": report.ranks, "trigger": TRIGGER} if report.ranks > 1 else None,
    )


def raise_unless_passed(report: LoadReport, checks: list[CheckResult]) -> None:
    """What the verdict means to the trainer: :class:`CheckpointCorrupt` for a checkpoint that
    failed (fall back), :class:`~drill.errors.StorageProblem` when the storage would not serve
    it (nothing is known about the checkpoint: falling back would not help)."""
    verdict = decide(checks)
    if verdict.status is DrillStatus.FAILED:
        findings = [f for c in checks for f in c.errors]
        findings.sort(key=lambda f: _CAUSE_FIRST.get(f.check, 9))  # damaged bytes explain entries that would not load
        raise CheckpointCorrupt(report.checkpoint, findings, report.byte_ranges)
    if verdict.status is DrillStatus.ERROR:
        raise StorageProblem(f"{report.checkpoint}: {verdict.message}")


_CAUSE_FIRST = {"integrity": 0, "files": 1, "load": 2}


# -- verifying a checkpoint another loader reads (Hugging Face's Trainer) ----------------------
def verify_for_resume(
    checkpoint: str, key: bytes | None, allow_classes: tuple[str, ...]
) -> tuple[LoadReport, list[CheckResult], int]:
    """``drill verify`` of the checkpoint a trainer is about to load by itself."""
    from drill.verifier import verify_checkpoint

    outcome = verify_checkpoint(str(checkpoint), key=key, allow_classes=allow_classes)
    result = outcome.result
    report = LoadReport(
        checkpoint=outcome.uri,
        sealed=result.evidence.get("evidence_level") == "sealed",
        evidence=evidence_of(result),
        bytes_read=outcome.bytes_hashed,
    )
    report.format = _format_of(outcome.uri)
    report.verified_files = int(result.evidence.get("files_verified", 0))
    report.seconds = {"verify": outcome.seconds, "total": outcome.seconds}
    report.byte_ranges = {p: [tuple(r) for r in rs] for p, rs in result.evidence.get("damaged_ranges", {}).items()}
    return report, [result], len(result.evidence.get("verified", []))


def _format_of(uri: str) -> str:
    from drill.discover import classify

    try:
        kind = classify(storage_for(uri), uri)
    except OSError:
        return "unknown"
    return kind.ref.format if kind.ref is not None else "unknown"


# -- the fallback ------------------------------------------------------------------------------
def fallback(root: str, before: str | None, db: str | None, min_evidence: str = DEFAULT_MIN_EVIDENCE) -> str | None:
    """The newest retained checkpoint (older than ``before``) whose latest drill passed on at
    least ``min_evidence``; else the newest one never drilled whose bytes prove out now at that
    level. A checkpoint whose latest drill did not pass is never a fallback."""
    from drill.claims import at_least
    from drill.discover import discover
    from drill.storage import normalize
    from drill.verifier import verify_checkpoint

    key = normalize(root)
    storage = storage_for(key)
    found = discover(storage, key).checkpoints  # oldest first
    if before is not None:
        stop = normalize(before).rstrip("/")
        index = next((i for i, c in enumerate(found) if c.uri.rstrip("/") == stop), len(found))
        found = found[:index]
    if not found:
        return None
    good, drilled = _recorded(key, [c.uri for c in found], db, min_evidence)
    if good is not None:
        return good
    for candidate in reversed(found):
        if candidate.uri in drilled:
            continue  # its latest drill failed (or proved too little): not a place to resume from
        try:
            outcome = verify_checkpoint(candidate.uri, storage=storage)
        except Exception:  # noqa: BLE001 - an unverifiable candidate is not a fallback
            continue
        if outcome.status == "passed" and at_least(evidence_of(outcome.result), min_evidence):
            return candidate.uri
    return None


def _recorded(root: str, retained: list[str], db: str | None, min_evidence: str) -> tuple[str | None, set[str]]:
    """(the newest good checkpoint by the record, every one the record holds a drill of)."""
    try:
        from drill.records.db import read_database
        from drill.records.store import Records

        database = read_database(db)
        if database is None:
            return None, set()
        try:
            records = Records(database)
            good = records.last_good(root, retained, min_evidence=min_evidence)
            drilled = set(records.latest_of(retained))
        finally:
            database.close()
    except Exception:  # noqa: BLE001 - no database: verify instead
        return None, set()
    return (good.checkpoint.uri if good is not None and good.checkpoint is not None else None), drilled
