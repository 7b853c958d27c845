"""Every entry of the checkpoint deserialized safely and landed on the target device."""

from __future__ import annotations

import re
from collections import defaultdict

from drill.checks import CheckInputs
from drill.findings import CheckResult, Finding, Severity
from drill.restore import ItemFailure, RestoreResult
from drill.units import human_bytes

NAME = "load"
SHOWN_KEYS = 5


ALLOW_HINT = "if the class is legitimate for this layout, allow-list it: --allow-class module.Class"
DANGEROUS = (
    "os.",
    "posix.",
    "nt.",
    "subprocess.",
    "builtins.",
    "__builtin__.",
    "sys.",
    "shutil.",
    "socket.",
    "importlib.",
    "runpy.",
    "pty.",
    "webbrowser.",
)
"""Modules whose globals run commands or code: a pickle naming them is hostile, not a layout to allow."""


def unsafe_hint(reason: str) -> str:
    """What to do about a refused pickle: allow-list a legitimate class, or treat it as hostile."""
    named = re.search(r"names ([\w.]+)|references ([\w.]+)", reason)
    name = next((g for g in (named.groups() if named else ()) if g), None)
    if name and name.startswith(DANGEROUS):
        return f"{name} runs commands or code: this checkpoint is hostile or corrupted — never load it with torch.load(weights_only=False)"
    if name:
        return f"if {name} is legitimate for this layout, allow-list it: --allow-class {name}"
    return ALLOW_HINT


def check_load(inputs: CheckInputs) -> CheckResult:
    restore = inputs.restore
    assert restore is not None
    evidence = {
        "device": restore.device,
        "tensors": restore.tensors_loaded,
        "tensor_bytes": restore.tensor_bytes,
        "values": restore.values_loaded,
        "failed": len(restore.failures),
    }
    if restore.metadata_error is not None:
        return CheckResult(
            name=NAME,
            summary="the checkpoint's index could not be loaded",
            findings=[_index_finding(restore)],
            evidence=evidence,
        )
    findings = [_entry_finding(f) for f in restore.failures if not _lost_with_file(f)] + _lost_files(restore.failures)
    if findings:
        summary = f"{len(restore.failures)} entries failed to load onto {restore.device}"
    else:
        summary = f"{restore.tensors_loaded} tensors ({human_bytes(restore.tensor_bytes)}) and {restore.values_loaded} values loaded onto {restore.device}"
    return CheckResult(name=NAME, summary=summary, findings=findings, evidence=evidence)


def _index_finding(restore: RestoreResult) -> Finding:
    """Nothing could be loaded: say why, and what to do about it for that reason."""
    unsafe = [f for f in restore.failures if f.code == "unsafe-pickle"]
    bombs = [f for f in restore.failures if f.code == "pickle-bomb"]
    error = restore.metadata_error or ""
    if restore.metadata_code == "metadata-implausible":
        code, hint = (
            restore.metadata_code,
            "the index does not describe the files beside it: damaged or forged; nothing was allocated",
        )
    elif bombs or restore.metadata_code == "pickle-bomb":
        from drill.catalogue import CODES

        code, hint, unsafe = "pickle-bomb", CODES["pickle-bomb"].hint, bombs
    elif unsafe or "allow-list" in error:
        code, hint = "unsafe-pickle", unsafe_hint(unsafe[0].reason if unsafe else error)
    elif any(f.error_kind == "missing" for f in restore.files):
        code, hint = (
            "metadata-unreadable",
            "the save may not have finished; drill an older checkpoint: drill run --checkpoint step:N",
        )
    else:
        code, hint = (
            "metadata-unreadable",
            "the index is damaged; restore it from a replica or drill an older checkpoint",
        )
    subject = unsafe[0].relative_path if unsafe else (restore.index_file or restore.uri)
    return Finding(
        check=NAME,
        code=code,
        severity=Severity.ERROR,
        subject=subject,
        message=f"the checkpoint cannot be loaded ({unsafe[0].reason if unsafe else error}): nothing in it can be restored",
        hint=hint,
    )


def _lost_with_file(failure: ItemFailure) -> bool:
    return failure.relative_path is not None and failure.reason.startswith("file ")


def _entry_finding(failure: ItemFailure) -> Finding:
    return Finding(
        check=NAME,
        code=failure.code,
        severity=Severity.ERROR,
        subject=failure.key,
        message=f"{failure.key} did not load: {failure.reason}",
        actual=failure.reason,
        hint=unsafe_hint(failure.reason) if failure.code == "unsafe-pickle" else None,
    )


def _lost_files(failures: list[ItemFailure]) -> list[Finding]:
    """One finding per broken file rather than one per entry in it: a lost shard can hold
    thousands of entries, and the files check already names the file."""
    by_file: dict[str, list[str]] = defaultdict(list)
    for failure in failures:
        if _lost_with_file(failure):
            by_file[str(failure.relative_path)].append(failure.key)
    out = []
    for path, keys in sorted(by_file.items()):
        shown = ", ".join(sorted(keys)[:SHOWN_KEYS]) + (
            f" and {len(keys) - SHOWN_KEYS} more" if len(keys) > SHOWN_KEYS else ""
        )
        out.append(
            Finding(
                check=NAME,
                code="entries-lost-with-file",
                severity=Severity.ERROR,
                subject=path,
                message=f"{len(keys)} entries stored in {path} could not be loaded: {shown}",
                actual=sorted(keys),
            )
        )
    return out
