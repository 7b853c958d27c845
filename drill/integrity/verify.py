"""Comparing what was read with the manifests: the ``integrity`` check.

Stages, as pg_verifybackup: the manifest's own digest → missing and extra files → every
file's size and chunk digests → frameworks' manifests. Unsealed checkpoints get a structural
proof instead, and the verdict says which level of evidence it rests on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from drill.findings import CheckResult, CheckStatus, Finding, Severity
from drill.integrity.ahead import HeadStart
from drill.integrity.foreign import ForeignManifest, find_foreign_manifests
from drill.integrity.hashing import AS_SEALED, DEFAULT_CHUNK_SIZE, FileHashes, HashPlan
from drill.integrity.manifest import (
    MANIFEST_NAME,
    FileEntry,
    ListingTooLarge,
    Manifest,
    ManifestInvalid,
    list_files,
    read_manifest,
)
from drill.integrity.parallel import hash_files
from drill.integrity.sampling import SampleSpec, select_sample
from drill.storage import PathEscapesCheckpoint, Storage
from drill.units import human_bytes

NAME = "integrity"
SEALED = "sealed"
UNSEALED = "unsealed"


def _finding(code: str, subject: str | None, message: str, **kw: Any) -> Finding:
    return Finding(
        check=NAME, code=code, severity=kw.pop("severity", Severity.ERROR), subject=subject, message=message, **kw
    )


@dataclass(slots=True)
class Observed:
    """One file as the read saw it."""

    hashes: FileHashes | None = None
    """None when the file was not hashed (sampled out) or could not be read — or was compared
    with its seal where it was hashed (``as_sealed``)."""
    error: str | None = None
    as_sealed: bool = False
    """Read whole where it was hashed, at its sealed size and with its sealed digest
    (:data:`~drill.integrity.hashing.AS_SEALED`): :data:`READ_AS_SEALED`, every such file."""


READ_AS_SEALED = Observed(as_sealed=True)
"""Every file read and found as sealed where it was hashed: one object, never changed."""


@dataclass(slots=True, kw_only=True)
class IntegrityPlan:
    """Decided before the first byte is read: what the manifests say and what to hash."""

    checkpoint: str
    manifest: Manifest | None = None
    manifest_error: ManifestInvalid | None = None
    foreign: list[ForeignManifest] = field(default_factory=list)
    on_storage: dict[str, int] = field(default_factory=dict)
    """Regular files in the checkpoint → size, as listed before the read."""
    odd: dict[str, str] = field(default_factory=dict)
    """Entries that are not regular files (FIFOs, sockets, devices, dangling links): never opened."""
    listing_error: str | None = None
    listing_code: str = "path-escapes"
    """The finding a failed listing is: a path out of the checkpoint, or a listing past every bound."""
    sample: SampleSpec = field(default_factory=lambda: SampleSpec("all"))
    selected: set[str] = field(default_factory=set)
    """Paths to hash this time (all files unless sampled)."""
    hash_plan: HashPlan = field(default_factory=HashPlan)
    key: bytes | None = field(default=None, repr=False)
    """The seal key to authenticate the manifest with (never printed or recorded)."""
    ahead: HeadStart | None = field(default=None, repr=False)
    """The seal as read, and its files hashing, before this plan was made (:mod:`drill.integrity.ahead`)."""

    @property
    def refuse(self) -> bool:
        """A path that escapes the checkpoint: nothing in it may be opened."""
        return (
            self.listing_error is not None
            or (self.manifest_error is not None and self.manifest_error.code == "manifest-path-escapes")
            or any(f.error is not None and "outside the checkpoint" in str(f.error) for f in self.foreign)
        )

    @property
    def evidence_level(self) -> str:
        return SEALED if self.manifest is not None else UNSEALED


def plan_integrity(
    storage: Storage,
    checkpoint: str,
    sample: SampleSpec,
    last_verified: Mapping[str, Any] | None = None,
    always: tuple[str, ...] = (".metadata",),
    key: bytes | None = None,
    ahead: HeadStart | None = None,
) -> IntegrityPlan:
    """What to hash and what the manifests say (``ahead``: the seal already read, its files
    hashing — :func:`drill.integrity.ahead.head_start`)."""
    plan = IntegrityPlan(checkpoint=checkpoint, sample=sample, key=key, ahead=ahead)
    entry = storage.stat(checkpoint)
    if not entry.is_dir:  # a single-file checkpoint carries no manifest: structure only
        plan.on_storage = {entry.name: entry.size}
        plan.hash_plan = HashPlan(files=frozenset())
        return plan
    try:
        listing = list_files(storage, checkpoint)
    except PathEscapesCheckpoint as exc:
        plan.listing_error = str(exc)
        return plan
    except ListingTooLarge as exc:
        plan.listing_error, plan.listing_code = str(exc), "listing-too-large"
        return plan
    plan.on_storage, plan.odd = listing.files, listing.odd
    if ahead is not None:
        plan.manifest, plan.manifest_error = ahead.manifest, ahead.error
    else:
        try:
            plan.manifest, _ = read_manifest(storage, checkpoint)
        except ManifestInvalid as exc:
            plan.manifest_error = exc
    plan.foreign = find_foreign_manifests(storage, checkpoint, set(plan.on_storage))
    sha_files = frozenset(p for fm in plan.foreign for p in fm.sha256)
    # Only what a manifest vouches for is worth a digest: a file the seal does not list is
    # file-unlisted unread (a sparse terabyte planted beside the shards costs nothing), and
    # without a manifest only what a framework's manifest covers is hashed.
    universe = {p: s for p, s in plan.on_storage.items() if p in sha_files}
    if plan.manifest is not None:
        # A file whose size on storage is not its sealed size is a finding as it is listed
        # (size-mismatch): never read — a sparse terabyte claiming to be a shard costs nothing.
        universe.update({f.path: f.size for f in plan.manifest.files if plan.on_storage.get(f.path, f.size) == f.size})
    plan.selected = select_sample(sample, universe, last_verified, always)
    chunk = plan.manifest.chunk_size if plan.manifest is not None else DEFAULT_CHUNK_SIZE
    plan.hash_plan = HashPlan(
        chunk_size=chunk,
        files=None if sample.is_full and plan.manifest is not None else frozenset(plan.selected),
        sha256=sha_files & plan.selected,
    )
    return plan


def hash_remaining(storage: Storage, plan: IntegrityPlan, observed: dict[str, Observed]) -> None:
    """Hash the selected files the restore did not read (files no loader needs)."""
    on_storage = plan.on_storage
    todo = {p: on_storage[p] for p in plan.selected & on_storage.keys() if p not in observed}
    hashed = plan.ahead.take(todo, plan.hash_plan.sha256) if plan.ahead is not None else {}
    if len(hashed) < len(todo):
        rest = {p: size for p, size in todo.items() if p not in hashed}
        hashed.update(
            hash_files(storage, plan.checkpoint, rest, plan.hash_plan.chunk_size, sha256=plan.hash_plan.sha256)
        )
    for path, result in hashed.items():
        if result is AS_SEALED:
            observed[path] = READ_AS_SEALED
        elif isinstance(result, OSError):
            observed[path] = Observed(error=f"{result.strerror or result}")
        else:
            observed[path] = Observed(hashes=result)  # type: ignore[arg-type]


def bytes_hashed(plan: IntegrityPlan, observed: Mapping[str, Observed]) -> int:
    """The bytes read and hashed: each file hashed, at the size it was read at (a file read as
    sealed was read at its size on storage, which is its sealed size)."""
    on_storage, total = plan.on_storage, 0
    for path, seen in observed.items():
        if seen.hashes is not None:
            total += seen.hashes.size
        elif seen.as_sealed:
            total += on_storage.get(path, 0)
    return total


def mismatched_ranges(expected: tuple[str, ...], actual: list[str], chunk: int, size: int) -> list[tuple[int, int]]:
    bad = [
        i
        for i in range(max(len(expected), len(actual)))
        if i >= len(expected) or i >= len(actual) or expected[i] != actual[i]
    ]
    merged: list[list[int]] = []
    for i in bad:
        start, end = i * chunk, min((i + 1) * chunk, size)
        if merged and merged[-1][1] == start:
            merged[-1][1] = end
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def file_against_seal(path: str, entry: FileEntry, plan: IntegrityPlan, seen: Observed | None) -> Finding | None:
    """The one finding for a sealed file, or None when it matched (or was sampled out)."""
    size = plan.on_storage.get(path)
    if size is None:
        what = plan.odd.get(path)
        if what is not None:
            return _finding(
                "file-not-regular",
                path,
                f"{path} should be a sealed file of {entry.size} bytes but is {_odd(what)}: never opened",
            )
        return _finding(
            "file-missing",
            path,
            f"{path} is listed in the manifest ({entry.size} bytes) but missing: a resume from this checkpoint would fail",
            expected=entry.size,
            actual="missing",
            hint="restore the file from a replica, or fall back to an older checkpoint",
        )
    if size != entry.size:
        how = "truncated" if size < entry.size else "extended"
        return _finding(
            "size-mismatch",
            path,
            f"{path} is {how}: {size} bytes on storage, {entry.size} when sealed",
            expected=entry.size,
            actual=size,
        )
    if seen is not None and seen.error is not None:
        return _finding("file-unreadable", path, f"{path} cannot be read ({seen.error})", actual=seen.error)
    if seen is None or seen.hashes is None or seen.hashes.matches(entry.chunks):
        return None
    assert plan.manifest is not None
    ranges = mismatched_ranges(entry.chunks, seen.hashes.chunk_hex, plan.manifest.chunk_size, entry.size)
    where = ", ".join(f"{a}..{b}" for a, b in ranges[:4]) + (f" and {len(ranges) - 4} more" if len(ranges) > 4 else "")
    return _finding(
        "digest-mismatch",
        path,
        f"{path} differs from what was sealed in bytes {where}: silent corruption",
        expected=entry.xxh3_128,
        actual=seen.hashes.digest,
        hint="the bytes on storage are not the bytes written; restore this file from a replica",
    )


_ODD = {
    "dangling": "a dangling symlink",
    "loop": "a symlink that leads back into itself",
    "too-deep": "a directory nested deeper than any checkpoint layout (not walked)",
}


def _odd(kind: str) -> str:
    return _ODD.get(kind, "a FIFO, socket or device")


def _compare_manifest(plan: IntegrityPlan, observed: Mapping[str, Observed]) -> tuple[list[Finding], dict[str, Any]]:
    manifest = plan.manifest
    assert manifest is not None
    findings: list[Finding] = []
    verified: list[str] = []
    bytes_verified = 0
    damaged: dict[str, list[tuple[int, int]]] = {}
    on_storage, seen_of, proved = plan.on_storage, observed.get, verified.append
    for entry in sorted(manifest.files):  # by path: a seal lists each path once
        path, size, _, chunks = entry
        seen = seen_of(path)
        if seen is READ_AS_SEALED and on_storage.get(path) == size:  # compared where it was hashed
            proved(path)
            bytes_verified += size
            continue
        hashes = seen.hashes if seen is not None else None
        if (
            hashes is not None
            and seen.error is None  # type: ignore[union-attr]
            and on_storage.get(path) == size
            and hashes.matches(chunks)
        ):  # the common case, in one test: read whole, as sealed
            proved(path)
            bytes_verified += size
            continue
        finding = file_against_seal(path, entry, plan, seen)
        if finding is not None:
            findings.append(finding)
            if finding.code == "digest-mismatch" and hashes is not None:
                damaged[path] = mismatched_ranges(entry.chunks, hashes.chunk_hex, manifest.chunk_size, entry.size)
        elif hashes is not None:
            verified.append(path)
            bytes_verified += entry.size
    listed = {f.path for f in manifest.files}
    foreign = {fm.name for fm in plan.foreign}
    for path in sorted(
        (plan.on_storage.keys() | plan.odd.keys()) - listed - foreign
    ):  # a framework manifest may follow the seal
        on_disk = plan.on_storage.get(path)
        what = f"{on_disk} bytes" if on_disk is not None else _odd(plan.odd[path])
        findings.append(
            _finding(
                "file-unlisted",
                path,
                f"{path} ({what}) is in the checkpoint but not in its manifest: added after sealing",
                expected="absent",
                actual=on_disk,
            )
        )
    evidence = {
        "files_listed": len(listed),
        "bytes_listed": manifest.total_bytes,
        "files_verified": len(verified),
        "bytes_verified": bytes_verified,
        "verified": verified,
    }
    if damaged:
        evidence["damaged_ranges"] = damaged
    return findings, evidence


def _compare_foreign(
    fm: ForeignManifest, plan: IntegrityPlan, observed: Mapping[str, Observed]
) -> tuple[list[Finding], str]:
    findings = []
    proved = 0
    for path in sorted(fm.listed):
        if path not in plan.on_storage:
            findings.append(_finding("file-missing", path, f"{path} is listed in {fm.name} but missing"))
            continue
        if fm.kind != "megatron-sha256":
            proved += 1
            continue
        seen = observed.get(path)
        if seen is None or seen.hashes is None or seen.hashes.sha256 is None:
            continue
        if seen.hashes.sha256 != fm.sha256[path]:
            findings.append(
                _finding(
                    "digest-mismatch",
                    path,
                    f"{path} does not match its SHA-256 in {fm.name}",
                    expected=fm.sha256[path],
                    actual=seen.hashes.sha256,
                )
            )
        else:
            proved += 1
    return findings, f"{fm.name} proved the {fm.proves} for {proved} of {len(fm.listed)} files"


def _refusal(plan: IntegrityPlan, evidence: dict[str, Any]) -> CheckResult | None:
    """The check's result when a path leads out of the checkpoint: nothing may be opened."""
    if not plan.refuse:
        return None
    findings = []
    if plan.listing_error is not None:
        findings.append(_finding(plan.listing_code, plan.checkpoint, f"refused: {plan.listing_error}"))
    if plan.manifest_error is not None:
        findings.append(_finding(plan.manifest_error.code, MANIFEST_NAME, str(plan.manifest_error)))
    findings += [_finding(fm.error.code, fm.name, str(fm.error)) for fm in plan.foreign if fm.error is not None]
    evidence["level"] = "none"  # nothing was opened, so nothing was proven: not the seal's level
    return CheckResult(
        name=NAME,
        summary="refused: a path leads out of the checkpoint; nothing was opened",
        findings=findings,
        evidence=evidence,
    )


def seal_authentication(plan: IntegrityPlan, evidence: dict[str, Any]) -> tuple[list[Finding], str]:
    """Whether the seal is the key holder's: ``sealed and authenticated`` or ``sealed, unauthenticated``."""
    manifest = plan.manifest
    assert manifest is not None
    evidence["key_id"] = manifest.key_id
    if plan.key is None:
        evidence["authenticated"] = False
        keyed = " (keyed seal; no key given to check it)" if manifest.hmac_sha256 else ""
        return [], f"sealed, unauthenticated{keyed}"
    why = manifest.authenticate(plan.key)
    evidence["authenticated"] = why is None
    if why is None:
        return [], "sealed and authenticated"
    code = "manifest-unauthenticated" if manifest.hmac_sha256 is None else "manifest-hmac-mismatch"
    hint = (
        "if the checkpoint is genuine, seal it again with the key: drill seal --force --key-file KEY " + plan.checkpoint
    )
    return [
        _finding(code, MANIFEST_NAME, f"{MANIFEST_NAME} is not authenticated by the seal key: {why}", hint=hint)
    ], "sealed, NOT authenticated"


def _sealed_part(
    plan: IntegrityPlan, observed: Mapping[str, Observed], evidence: dict[str, Any]
) -> tuple[list[Finding], str]:
    auth, sealed = seal_authentication(plan, evidence)
    findings, ev = _compare_manifest(plan, observed)
    evidence.update(ev)
    evidence["manifests"][MANIFEST_NAME] = f"proved the content of {ev['files_verified']} of {ev['files_listed']} files"
    pct = 100.0 * ev["bytes_verified"] / ev["bytes_listed"] if ev["bytes_listed"] else 100.0
    if findings:
        return auth + findings, f"{sealed}: {len(findings)} mismatch(es) against the manifest"
    if plan.sample.is_full:
        return (
            auth,
            f"{sealed}: every byte matches the manifest ({ev['files_verified']} files, {human_bytes(ev['bytes_verified'])})",
        )
    return auth, f"{sealed}, sampled {plan.sample}: {pct:.0f}% of bytes verified this drill, all match"


def _unsealed_part(
    plan: IntegrityPlan,
    require_sealed: bool,
    structure: tuple[list[Finding], dict[str, Any]] | None,
    evidence: dict[str, Any],
) -> tuple[list[Finding], str]:
    findings = []
    if plan.manifest_error is None and require_sealed:
        findings.append(
            _finding(
                "not-sealed",
                plan.checkpoint,
                "the checkpoint carries no drill manifest and sealed checkpoints are required (--require-sealed)",
                hint=f"seal checkpoints when they are saved (drill.sdk.seal) or now: drill seal {plan.checkpoint}",
            )
        )
    findings += [
        _finding("file-not-regular", path, f"{path} is {_odd(kind)}, not checkpoint data: never opened")
        for path, kind in sorted(plan.odd.items())
    ]
    if structure is None:
        return findings, "unsealed: nothing proven — no content hashes, and no structural proof for this format"
    sf, sev = structure
    evidence["structure"] = sev
    consistent = not any(f.severity is Severity.ERROR for f in sf)
    return (
        findings + [f for f in sf if f.subject not in plan.odd],  # an entry never opened is named once, above
        "unsealed: structurally consistent, no content hashes" if consistent else "unsealed: structurally inconsistent",
    )


def _structure_under_seal(
    structure: tuple[list[Finding], dict[str, Any]] | None, evidence: dict[str, Any], flagged: set[str | None]
) -> list[Finding]:
    """A sealed checkpoint's structure is still checked where the restore read it: the seal
    and the structure are independent witnesses, and where the seal vouches for a file the
    structure finds broken, they disagree — a finding (files the seal already failed are not
    named twice)."""
    if structure is None:
        return []
    findings, sev = structure
    evidence["structure"] = sev
    return [f for f in findings if f.severity is Severity.ERROR and f.subject not in flagged]


def integrity_check(
    plan: IntegrityPlan,
    observed: Mapping[str, Observed],
    *,
    require_sealed: bool = False,
    structure: tuple[list[Finding], dict[str, Any]] | None = None,
) -> CheckResult:
    """The ``integrity`` check from the plan and what was read; ``structure`` is the
    structural proof for an unsealed checkpoint (see :mod:`drill.integrity.structure`)."""
    evidence: dict[str, Any] = {"evidence_level": plan.evidence_level, "sample": str(plan.sample), "manifests": {}}
    refused = _refusal(plan, evidence)
    if refused is not None:
        return refused
    findings = (
        [_finding(plan.manifest_error.code, MANIFEST_NAME, str(plan.manifest_error))] if plan.manifest_error else []
    )
    findings += [_finding(fm.error.code, fm.name, str(fm.error)) for fm in plan.foreign if fm.error is not None]
    if plan.manifest is not None:
        part, summary = _sealed_part(plan, observed, evidence)
        part += _structure_under_seal(structure, evidence, {f.subject for f in part})
    else:
        part, summary = _unsealed_part(plan, require_sealed, structure, evidence)
    findings += part
    summaries = [summary]
    for fm in plan.foreign:
        if fm.error is None:
            ff, proved = _compare_foreign(fm, plan, observed)
            findings += ff
            evidence["manifests"][fm.name] = proved
            summaries.append(proved)
    if not plan.sample.is_full:
        evidence["sampled"] = sorted(plan.selected)
    evidence["level"] = _level(plan, evidence)
    result = CheckResult(name=NAME, summary="; ".join(summaries), findings=findings, evidence=evidence)
    if evidence["level"] == "none" and result.status is CheckStatus.PASSED:
        result.skipped = True  # nothing was proven: a gap in the evidence, never a pass
    return result


def _level(plan: IntegrityPlan, evidence: dict[str, Any]) -> str:
    """What the proof rests on (:func:`drill.claims.level`): a seal (or a framework's content
    manifest), its authentication, or the format's structure."""
    from drill.claims import level

    content = plan.manifest is not None or any(fm.kind == "megatron-sha256" and fm.error is None for fm in plan.foreign)
    structural = "structure" in evidence or any(fm.error is None for fm in plan.foreign)
    return level(sealed=content, authenticated=evidence.get("authenticated") is True, structural=structural)
