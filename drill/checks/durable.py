"""The ``durable`` check: is the checkpoint's copy on the durable tier complete and identical?

Large runs checkpoint to node-local NVMe and drain to a durable parallel filesystem or object
store; after a node is lost, the restore reads the durable copy. This check reads that copy in
full (concurrent ranged GETs on object storage) and compares every file with the manifest the
drilled copy was just verified against — so the drill proves the copy a recovery will use,
and says whether the drain finished.
"""

from __future__ import annotations

from typing import Any

from drill.checks import CheckInputs
from drill.findings import CheckResult, Finding, Severity, not_run
from drill.integrity.hashing import DEFAULT_CHUNK_SIZE
from drill.integrity.manifest import MANIFEST_NAME, list_files
from drill.integrity.parallel import hash_files
from drill.storage import PathEscapesCheckpoint, storage_for
from drill.units import human_bytes

NAME = "durable"


def _f(code: str, subject: str, message: str, severity: Severity = Severity.ERROR, **kw: Any) -> Finding:
    return Finding(check=NAME, code=code, severity=severity, subject=subject, message=message, **kw)


def durable_copy(durable_root: str, root: str, checkpoint: str) -> str:
    """Where the checkpoint's copy lies on the durable tier: the same path under its root."""
    if checkpoint.rstrip("/") == root.rstrip("/"):
        return durable_root
    relative = checkpoint.rstrip("/")[len(root.rstrip("/")) + 1 :]
    return f"{durable_root.rstrip('/')}/{relative}"


def _reference(inputs: CheckInputs) -> tuple[dict[str, tuple[int, tuple[str, ...]]], int, str]:
    """What each file must be — (size, chunk digests) by path — and the chunk size, and
    where that comes from: the sealed manifest, else the drilled copy's own bytes."""
    plan = inputs.plan
    assert plan is not None
    if plan.manifest is not None:
        return {f.path: (f.size, f.chunks) for f in plan.manifest.files}, plan.manifest.chunk_size, MANIFEST_NAME
    hashed = hash_files(inputs.storage, plan.checkpoint, plan.on_storage, DEFAULT_CHUNK_SIZE)
    ref = {p: (h.size, tuple(h.chunk_hex)) for p, h in hashed.items() if not isinstance(h, OSError)}
    return ref, DEFAULT_CHUNK_SIZE, "the drilled copy's bytes (unsealed)"


def check_durable(inputs: CheckInputs) -> CheckResult:
    if inputs.durable is None:
        return not_run(NAME, "no durable tier to compare with (--durable URI)")
    if inputs.plan is None or inputs.ref is None:
        return not_run(NAME, "no checkpoint was drilled")
    copy = durable_copy(inputs.durable, inputs.root, inputs.ref.uri)
    storage = storage_for(copy, inputs.storage_options)
    expected, chunk, source = _reference(inputs)
    try:
        present = list_files(storage, copy)
    except PathEscapesCheckpoint as exc:
        return CheckResult(
            name=NAME,
            summary="refused: a path leads out of the durable copy",
            findings=[_f("path-escapes", copy, str(exc))],
        )
    except OSError as exc:
        finding = _f(
            "durable-missing",
            copy,
            f"the durable copy {copy} cannot be listed ({exc.strerror or exc}): the drain never started, or it is not where expected",
        )
        return CheckResult(
            name=NAME, summary=f"durable copy not found at {copy}", findings=[finding], evidence={"copy": copy}
        )
    findings = _compare(copy, expected, present.files, storage, chunk)
    evidence = {
        "copy": copy,
        "against": source,
        "files_expected": len(expected),
        "files_present": len(present.files),
        "bytes": sum(s for s, _ in expected.values()),
    }
    total = sum(s for s, _ in expected.values())
    if not findings:
        summary = f"durable copy complete and identical: {len(expected)} files, {human_bytes(total)} at {copy}"
    else:
        kinds = sorted({f.code.removeprefix("durable-") for f in findings if f.severity is Severity.ERROR})
        summary = f"durable copy at {copy} is not the drilled checkpoint: {', '.join(kinds) or 'extra files'}"
    return CheckResult(name=NAME, summary=summary, findings=findings, evidence=evidence)


def _compare(
    copy: str, expected: dict[str, tuple[int, tuple[str, ...]]], present: dict[str, int], storage: Any, chunk: int
) -> list[Finding]:
    findings = [
        _f(
            "durable-missing",
            path,
            f"{path} is not in the durable copy {copy}: the drain did not finish; a restore from it would fail",
            expected=size,
            actual="missing",
        )
        for path, (size, _) in sorted(expected.items())
        if path not in present
    ]
    same_size = {p: present[p] for p, (size, _) in expected.items() if present.get(p) == size}
    findings += [
        _f(
            "durable-size-mismatch",
            p,
            f"{p} is {present[p]} bytes in the durable copy, {expected[p][0]} in the checkpoint",
            expected=expected[p][0],
            actual=present[p],
        )
        for p in sorted(expected)
        if p in present and p not in same_size
    ]
    for path, got in sorted(hash_files(storage, copy, same_size, chunk).items()):
        if isinstance(got, OSError):
            findings.append(
                _f("durable-unreadable", path, f"{path} in the durable copy cannot be read ({got.strerror or got})")
            )
        elif not got.matches(expected[path][1]):
            bad = [i for i, (a, b) in enumerate(zip(got.chunk_hex, expected[path][1], strict=False)) if a != b]
            where = f"bytes {bad[0] * chunk}.." if bad else "its bytes"
            findings.append(
                _f(
                    "durable-digest-mismatch",
                    path,
                    f"{path} in the durable copy differs from the checkpoint from {where}: the copies are not identical",
                )
            )
    extra = sorted(set(present) - set(expected) - {MANIFEST_NAME})
    findings += [
        _f("durable-extra", p, f"{p} is in the durable copy but not in the checkpoint", Severity.WARNING) for p in extra
    ]
    return findings
