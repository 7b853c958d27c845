"""Every entry of the checkpoint deserialized safely and landed on the target device."""

from __future__ import annotations

from collections import defaultdict

from drill.checks import CheckInputs
from drill.findings import CheckResult, Finding, Severity
from drill.units import human_bytes

NAME = "load"
SHOWN_KEYS = 5


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
        unsafe = [f for f in restore.failures if f.code == "unsafe-pickle"]
        finding = Finding(
            check=NAME,
            code="unsafe-pickle" if unsafe else "metadata-unreadable",
            severity=Severity.ERROR,
            subject=unsafe[0].relative_path if unsafe else (".metadata" if restore.format == "dcp" else restore.uri),
            message=f"the checkpoint cannot be loaded ({restore.metadata_error}): nothing in it can be restored",
            hint="if the class is legitimate for this layout, allow-list it: --allow-class module.Class"
            if unsafe
            else "the save may not have finished; drill an older checkpoint: drill run --checkpoint step:N",
        )
        return CheckResult(name=NAME, summary="checkpoint metadata could not be loaded", findings=[finding], evidence=evidence)

    findings = []
    # One finding per broken file rather than one per entry in it: a lost shard can hold
    # thousands of entries, and the files check already names the file.
    by_file: dict[str, list[str]] = defaultdict(list)
    for failure in restore.failures:
        if failure.relative_path is not None and failure.reason.startswith("file "):
            by_file[failure.relative_path].append(failure.key)
            continue
        findings.append(
            Finding(
                check=NAME,
                code=failure.code,
                severity=Severity.ERROR,
                subject=failure.key,
                message=f"{failure.key} did not load: {failure.reason}",
                actual=failure.reason,
                hint="if the class is legitimate for this layout, allow-list it: --allow-class module.Class"
                if failure.code == "unsafe-pickle"
                else None,
            )
        )
    for path, keys in sorted(by_file.items()):
        shown = ", ".join(sorted(keys)[:SHOWN_KEYS]) + (f" and {len(keys) - SHOWN_KEYS} more" if len(keys) > SHOWN_KEYS else "")
        findings.append(
            Finding(
                check=NAME,
                code="entries-lost-with-file",
                severity=Severity.ERROR,
                subject=path,
                message=f"{len(keys)} entries stored in {path} could not be loaded: {shown}",
                actual=sorted(keys),
            )
        )
    if findings:
        summary = f"{len(restore.failures)} entries failed to load onto {restore.device}"
    else:
        summary = (
            f"{restore.tensors_loaded} tensors ({human_bytes(restore.tensor_bytes)}) and "
            f"{restore.values_loaded} values loaded onto {restore.device}"
        )
    return CheckResult(name=NAME, summary=summary, findings=findings, evidence=evidence)
