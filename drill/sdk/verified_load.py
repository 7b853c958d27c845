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

from drill.claims import DEFAULT_MIN_EVIDENCE, evidence_of, level
from drill.findings import CheckResult, Finding, Severity
from drill.formats.base import RestoreContext, one_line
from drill.formats.dcp_reader import DCPStorageReader, SafeLoadPlanner, dcp_load
from drill.integrity.hashing import HashPlan
from drill.integrity.manifest import MANIFEST_NAME
from drill.integrity.sampling import SampleSpec
from drill.integrity.verify import IntegrityPlan, Observed, file_against_seal, mismatched_ranges, plan_integrity, seal_authentication
from drill.restore import RestoreResult
from drill.sdk.resume import TRIGGER, LoadReport
from drill.storage import storage_for


def run_load(
    state: dict[str, Any], checkpoint_id: str, verify: bool, process_group: Any, planner: Any, key: bytes | None, allow_classes: tuple[str, ...]
) -> tuple[LoadReport, list[Finding], RestoreResult]:
    """Load, then compare what this rank read with the seal; every rank gets every rank's findings."""
    storage = storage_for(str(checkpoint_id))
    uri = storage.normalize(str(checkpoint_id))
    started = time.perf_counter()
    plan = plan_integrity(storage, uri, SampleSpec("all"), key=key) if verify else None
    sealed = plan is not None and plan.manifest is not None
    report = LoadReport(checkpoint=uri, sealed=sealed)
    report.seconds["plan"] = time.perf_counter() - started
    result = RestoreResult(uri=uri, format="dcp", device="cpu")
    hash_plan = HashPlan(chunk_size=plan.hash_plan.chunk_size) if sealed else HashPlan(files=frozenset())  # type: ignore[union-attr]
    reader = DCPStorageReader(storage, uri, result, RestoreContext(device=torch.device("cpu"), hash_plan=hash_plan, allow_classes=allow_classes))
    findings = _refused(plan) if plan is not None and plan.refuse else _read(state, reader, result, planner, process_group)
    report.seconds["read"], report.seconds["load"] = result.read_seconds, result.load_seconds
    checked = time.perf_counter()
    if plan is not None and sealed and not plan.refuse:
        findings += _against_seal(plan, result, report.byte_ranges)
        authenticated = key is not None and not any(f.code.startswith("manifest-") for f in findings)
        report.evidence = level(sealed=True, authenticated=authenticated)
    report.seconds["verify"] = time.perf_counter() - checked
    report.verified_files = sum(1 for f in result.files if f.hashes is not None) if sealed else 0
    report.bytes_read = result.bytes_read
    findings.sort(key=lambda f: _CAUSE_FIRST.get(f.check, 9))  # damaged bytes explain entries that would not load
    findings, report.byte_ranges, report.ranks, report.bytes_read = _agree(findings, report.byte_ranges, report.bytes_read, process_group)
    return report, findings, result


_CAUSE_FIRST = {"integrity": 0, "files": 1, "load": 2}


def _read(state: dict[str, Any], reader: DCPStorageReader, result: RestoreResult, planner: Any, process_group: Any) -> list[Finding]:
    distributed = dist.is_available() and dist.is_initialized()
    try:
        dcp_load(state, reader, planner or SafeLoadPlanner(result.failures), process_group, distributed)
    except Exception as exc:  # noqa: BLE001 - DCP wraps every rank's failure; it is the finding
        return [_finding("load", "checkpoint-not-loaded", reader.uri, f"the checkpoint did not load: {one_line(exc)}")]
    findings = [_finding("files", f.error_kind and f"file-{f.error_kind}" or "file-unreadable", f.relative_path, f"{f.relative_path}: {f.error}") for f in result.files if f.error]
    findings += [_finding("load", f.code or "entry-not-loaded", f.key, f"{f.key} did not load: {f.reason}") for f in result.failures]
    return findings


def _against_seal(plan: IntegrityPlan, result: RestoreResult, ranges: dict[str, list[tuple[int, int]]]) -> list[Finding]:
    """The files this rank read, against the seal (``ranges`` gets each damaged file's byte
    ranges); plus the seal's own authentication when a key was given."""
    assert plan.manifest is not None
    listed = plan.manifest.by_path()
    findings = seal_authentication(plan, {})[0]
    for f in result.files:
        entry = listed.get(f.relative_path)
        if entry is None:
            findings.append(_finding("integrity", "file-unlisted", f.relative_path, f"{f.relative_path} was read but is not in {MANIFEST_NAME}: added after sealing"))
            continue
        finding = file_against_seal(f.relative_path, entry, plan, Observed(hashes=f.hashes, error=f.error))
        if finding is None:
            continue
        findings.append(finding)
        if f.hashes is not None and finding.code == "digest-mismatch":
            ranges[f.relative_path] = mismatched_ranges(entry.chunks, f.hashes.chunk_hex, plan.manifest.chunk_size, entry.size)
    return findings


def _refused(plan: IntegrityPlan) -> list[Finding]:
    why = plan.listing_error or (str(plan.manifest_error) if plan.manifest_error else "a path leads out of the checkpoint")
    return [_finding("integrity", "path-escapes", plan.checkpoint, f"refused before reading: {why}")]


def _agree(findings: list[Finding], ranges: dict[str, list[tuple[int, int]]], nbytes: int, process_group: Any) -> tuple[list[Finding], dict[str, list[tuple[int, int]]], int, int]:
    """Every rank's findings on every rank: all raise, or none does (one rank training on while
    another falls back would hang the job)."""
    if not (dist.is_available() and dist.is_initialized()):
        return findings, ranges, 1, nbytes
    world = dist.get_world_size(process_group)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (findings, ranges, nbytes), group=process_group)
    merged: list[Finding] = []
    where: dict[str, list[tuple[int, int]]] = {}
    for theirs, their_ranges, _ in gathered:
        merged += [f for f in theirs if f not in merged]
        where.update(their_ranges)
    return merged, where, world, sum(n for _, _, n in gathered)


def _finding(check: str, code: str, subject: str | None, message: str) -> Finding:
    return Finding(check=check, code=code, severity=Severity.ERROR, subject=subject, message=message)


# -- the record --------------------------------------------------------------------------------
def outcome_of(report: LoadReport, findings: list[Finding], files: int, began: datetime, checks: list[CheckResult] | None = None) -> Any:
    """The resume as a drill outcome: integrity, files and load checks (or ``checks``), latency per phase."""
    from drill import __version__
    from drill.discover import step_of
    from drill.errors import ExitCode
    from drill.pipeline.outcome import CheckpointInfo, DrillOutcome, Timings
    from drill.verdict import DrillStatus

    plain = findings
    name = report.checkpoint.rstrip("/").rsplit("/", 1)[-1]
    failed = bool(plain)
    return DrillOutcome(
        id=None,
        status=DrillStatus.FAILED if failed else DrillStatus.PASSED,
        exit_code=ExitCode.FAILED if failed else ExitCode.PASSED,
        message=plain[0].message if failed else None,
        run_root=report.checkpoint.rstrip("/").rsplit("/", 1)[0] or "/",
        selector=name,
        trigger=TRIGGER,
        host=socket.gethostname(),
        pid=os.getpid(),
        device="cpu",
        started_at=began,
        finished_at=datetime.now(timezone.utc),
        phase="record",
        checkpoint=CheckpointInfo(uri=report.checkpoint, name=name, step=step_of(name), format=report.format, bytes=report.bytes_read, files=files),
        selection="resume",
        timings=Timings(restore=report.seconds.get("total"), plan=report.seconds.get("plan"), read=report.seconds.get("read"), load=report.seconds.get("load")),
        bytes_read=report.bytes_read,
        evidence_level=report.evidence,
        checks=checks if checks is not None else _checks(report, plain),
        versions={"drill": __version__, "torch": torch.__version__},
        distributed={"world_size": report.ranks, "trigger": TRIGGER} if report.ranks > 1 else None,
    )


def _checks(report: LoadReport, findings: list[Finding]) -> list[CheckResult]:
    out = []
    for name, ok in (
        ("integrity", f"sealed: every byte read matches the seal ({report.verified_files} files)" if report.sealed else "unsealed: no seal to compare the bytes with"),
        ("files", "every file the load needed was read in full"),
        ("load", "every entry loaded into the trainer's objects"),
    ):
        mine = [f for f in findings if f.check == name]
        out.append(CheckResult(name=name, summary=f"{len(mine)} problem(s): {mine[0].message}" if mine else ok, findings=mine, evidence={"trigger": TRIGGER}))
    return out


# -- verifying a checkpoint another loader reads (Hugging Face's Trainer) ----------------------
def verify_for_resume(checkpoint: str, key: bytes | None, allow_classes: tuple[str, ...]) -> tuple[LoadReport, list[Finding], int, list[CheckResult]]:
    """``drill verify`` of the checkpoint a trainer is about to load by itself."""
    from drill.verifier import verify_checkpoint

    outcome = verify_checkpoint(str(checkpoint), key=key, allow_classes=allow_classes)
    result = outcome.result
    report = LoadReport(checkpoint=outcome.uri, sealed=result.evidence.get("evidence_level") == "sealed", evidence=evidence_of(result), bytes_read=outcome.bytes_hashed)
    report.format = _format_of(outcome.uri)
    report.verified_files = int(result.evidence.get("files_verified", 0))
    report.seconds = {"verify": outcome.seconds, "total": outcome.seconds}
    findings = [f for f in result.findings if f.severity is Severity.ERROR]
    return report, findings, len(result.evidence.get("verified", [])), [result]


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
