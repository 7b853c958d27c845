"""Every file the checkpoint's metadata names is present and was read in full."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from drill import formats
from drill.checks import CheckInputs
from drill.findings import CheckResult, Finding, Severity
from drill.integrity.manifest import MANIFEST_NAME
from drill.integrity.reading import INFRASTRUCTURE
from drill.restore import FileRead
from drill.units import human_bytes

NAME = "files"

_CODES = {
    "missing": ("file-missing", "is missing"),
    "unreadable": ("file-unreadable", "cannot be read"),
    "escapes": ("path-escapes", "would be read from outside the checkpoint"),
    "not-regular": ("file-not-regular", "is not a regular file"),
    "changed": ("file-changed", "changed while it was read"),
    "denied": ("storage-denied", "could not be read: the storage refused drill"),
    "unavailable": ("storage-unavailable", "could not be read: the storage kept failing"),
}


def check_files(inputs: CheckInputs) -> CheckResult:
    restore = inputs.restore
    assert restore is not None
    listed = inputs.plan.on_storage if inputs.plan is not None else {}
    findings = [_unreadable(f) for f in restore.files if f.error_kind is not None]
    findings += _changed(restore.files, listed)
    findings += [
        _layout_missing(name, why) for name, why in (restore.layout.missing_files if restore.layout else {}).items()
    ]
    findings += [replace(f, check=NAME) for f in formats.get(restore.format).missing_files(listed, restore)]
    findings += _missing_beside_peers(inputs, listed, {str(f.subject) for f in findings})
    infra = [f for f in restore.files if f.error_kind in INFRASTRUCTURE]
    ok = [f for f in restore.files if f.error_kind is None]
    read = {f.relative_path for f in restore.files}
    total = restore.bytes_read
    others = sum(1 for p in listed if p not in read and p != MANIFEST_NAME)
    why = (
        "not read: the checkpoint's index could not be loaded"
        if restore.metadata_error
        else "in the directory not needed to resume"
    )
    beside = f"; {others} other file(s) {why} (listed in the evidence)" if others else ""
    if findings:
        summary = f"{len({f.subject for f in findings})} file(s) missing, unreadable or changed of {len(restore.files)} the checkpoint needs{beside}"
    else:
        summary = f"all {len(restore.files)} files present and read in full ({human_bytes(total)}){beside}"
    evidence = {
        "files": [
            {
                "path": f.relative_path,
                "size": f.size,
                "bytes_read": f.bytes_read,
                "xxh3_128": f.hashes.digest if f.hashes else None,
                "entries": f.items,
                "error": f.error,
                **({"retries": f.retries} if f.retries else {}),
            }
            for f in restore.files
        ],
        "not_read": sorted(p for p in listed if p not in read),
        "files_ok": len(ok),
        "bytes_read": total,
    }
    # The storage's fault, and nothing wrong with the checkpoint found besides: drill could not
    # judge it (error, exit 5) — never a verdict that blames the checkpoint.
    errored = bool(infra) and all(
        f.code in ("storage-denied", "storage-unavailable") for f in findings if f.severity is Severity.ERROR
    )
    return CheckResult(name=NAME, summary=summary, findings=findings, evidence=evidence, errored=errored)


def _changed(files: list[Any], listed: dict[str, int]) -> list[Finding]:
    """Files whose size when read differs from their size when listed: a save writing into it."""
    return [
        Finding(
            check=NAME,
            code="file-changed",
            severity=Severity.ERROR,
            subject=f.relative_path,
            message=f"{f.relative_path} changed while the drill ran: {listed[f.relative_path]} bytes when listed, {f.size} when read "
            "(a save writing into this checkpoint?)",
            expected=listed[f.relative_path],
            actual=f.size,
            hint="drill a checkpoint no save is writing into, or give saves time to settle (a policy's selection.settle)",
        )
        for f in files
        if f.error_kind is None and f.size is not None and listed.get(f.relative_path, f.size) != f.size
    ]


PEERS = 2
"""How many of the run's saves of the same format a checkpoint's files are compared with: the nearest."""


def _missing_beside_peers(inputs: CheckInputs, listed: dict[str, int], named: set[str]) -> list[Finding]:
    """Files its writer writes on every save (:meth:`~drill.formats.base.Format.every_save`)
    that the run's neighbouring saves hold and this one lacks."""
    ref, found = inputs.ref, inputs.discovery
    if ref is None or found is None or not listed:
        return []
    fmt = formats.get(ref.format)
    same = [c for c in found.checkpoints if c.format == ref.format]
    if ref not in same:
        return []
    here = same.index(ref)
    nearest = sorted((j for j in range(len(same)) if j != here), key=lambda j: (abs(j - here), j))[:PEERS]
    peers, held = [], None
    for peer in (same[j] for j in nearest):
        try:
            names = {e.name for e in inputs.storage.list(peer.uri) if e.is_file and fmt.every_save(e.name)}
        except OSError:
            continue  # a neighbour that cannot be listed proves nothing either way
        peers.append(peer.name)
        held = names if held is None else held & names
    top = {p for p in listed if "/" not in p}
    return [
        _layout_missing(
            name, f"the run's other saves ({', '.join(peers)}) hold it and its writer writes it on every save"
        )
        for name in sorted((held or set()) - top - named)
    ]


def _layout_missing(name: str, why: str) -> Finding:
    return Finding(
        check=NAME,
        code="file-missing",
        severity=Severity.ERROR,
        subject=name,
        message=f"{name} is missing: {why}",
        expected="present",
        actual="missing",
        hint="restore the file from a replica or drill an older checkpoint: drill run --checkpoint step:N",
    )


def _unreadable(f: FileRead) -> Finding:
    code, verb = _CODES.get(f.error_kind or "", ("file-unreadable", "cannot be read"))
    if f.error_kind in INFRASTRUCTURE:
        return Finding(
            check=NAME, code=code, severity=Severity.ERROR, subject=f.relative_path, message=f"{f.relative_path} {verb} ({f.error}): nothing is known about its bytes",
            actual=f.error, hint="check the credentials and permissions drill runs with, and that the storage is reachable; then drill again",
        )  # fmt: skip
    holds = f" and holds {f.items} state entries" if f.items else ""
    return Finding(
        check=NAME,
        code=code,
        severity=Severity.ERROR,
        subject=f.relative_path,
        message=f"{f.relative_path} {verb} ({f.error}){holds}: a resume from this checkpoint would fail",
        expected="present and readable",
        actual=f.error,
        hint="restore the file from a replica or drill an older checkpoint: drill run --checkpoint step:N",
    )
