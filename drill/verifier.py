"""``drill verify``: prove a checkpoint's bytes without loading its tensors.

Sealed checkpoints are hashed against their manifest (in parallel, one read per file);
unsealed ones get the structural proof their format allows. Torch is imported only for an
unsealed DCP checkpoint, whose ``.metadata`` must be read to check it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from drill import formats
from drill.checkpoints import Discovery, IncompleteSave, step_of
from drill.claims import evidence_of
from drill.discover import PathKind, classify
from drill.errors import ExitCode, NothingToDrill, UsageError, named, storage_unavailable
from drill.findings import CheckResult, CheckStatus, Finding, Severity
from drill.integrity.ahead import HeadStart, head_start
from drill.integrity.hashing import DEFAULT_CHUNK_SIZE
from drill.integrity.manifest import MANIFEST_NAME, SealConflict, SealResult, seal_files
from drill.integrity.proof import prove
from drill.integrity.reading import describe_read_error, read_whole
from drill.integrity.sampling import SampleSpec
from drill.integrity.verify import NAME, Observed, bytes_hashed, plan_integrity
from drill.memory import collector_paused
from drill.storage import Storage, StorageUnavailable, storage_for
from drill.storage.listed import ListedOnce

if TYPE_CHECKING:
    from drill.records.lite import Ledger


@dataclass(slots=True, kw_only=True)
class VerifyOutcome:
    uri: str
    result: CheckResult
    seconds: float
    bytes_hashed: int

    @property
    def evidence(self) -> str:
        """What the verification rests on (:mod:`drill.claims`)."""
        return evidence_of(self.result)

    @property
    def status(self) -> str:
        """``passed``, ``failed``, or ``unproven``: nothing could be proven — no seal, and no
        structural proof for this format. Never a pass (exit 8)."""
        if self.result.status is CheckStatus.FAILED:
            return "failed"
        return "unproven" if self.evidence == "none" else "passed"

    @property
    def exit_code(self) -> ExitCode:
        return {"failed": ExitCode.FAILED, "unproven": ExitCode.UNPROVEN}.get(self.status, ExitCode.PASSED)


def _verify_file(storage: Storage, uri: str, size: int) -> CheckResult:
    from drill.integrity.structure import safetensors_structure, sniff, zip_structure

    name = uri.rstrip("/").rsplit("/", 1)[-1]
    try:
        view = read_whole(storage, uri, size, hash=False).view
    except (OSError, EOFError) as exc:
        why, kind = describe_read_error(exc)
        code = {"changed": "file-changed", "not-regular": "file-not-regular"}.get(kind, "file-unreadable")
        return CheckResult(
            name=NAME,
            summary=f"{name} cannot be read",
            findings=[Finding(check=NAME, code=code, severity=Severity.ERROR, subject=name, message=f"{name}: {why}")],
        )
    sniffed = sniff(view)
    kind = sniffed or ""
    if kind == "zip":
        findings, evidence = zip_structure(view, name)
    elif kind == "safetensors":
        findings, evidence = safetensors_structure(view, name)
    else:
        return CheckResult(
            name=NAME,
            summary=f"{name}: unknown file format; nothing could be proved",
            findings=[
                Finding(
                    check=NAME,
                    code="format-unknown",
                    severity=Severity.ERROR,
                    subject=name,
                    message=f"{name} is neither a torch.save zip nor safetensors",
                )
            ],
        )
    evidence = {"evidence_level": "unsealed", "format": kind, "structure": evidence}
    ok = not any(f.severity is Severity.ERROR for f in findings)
    what = "every record's CRC-32 matches" if kind == "zip" else "header offsets tile the file"
    summary = (
        f"unsealed {kind}: structurally consistent ({what}), no content hashes"
        if ok
        else f"unsealed {kind}: structurally inconsistent"
    )
    return CheckResult(name=NAME, summary=summary, findings=findings, evidence=evidence)


def _refuse_a_directory_of_runs(storage: Storage, uri: str, looked_at: int = 64) -> None:
    """A directory that is no checkpoint itself (no seal, no shard index at its top) but holds
    runs or checkpoints: a usage error naming them, as for a run directory — never a verdict on
    the manifests of the checkpoints inside it, read as if they were its own."""
    listed = storage.list(uri)
    if any(e.name == MANIFEST_NAME or e.name.endswith(".safetensors.index.json") for e in listed if e.is_file):
        return
    below = []
    for entry in [e for e in listed if e.is_dir][:looked_at]:
        try:
            if classify(storage, entry.uri).kind in ("checkpoint", "run-root", "incomplete"):
                below.append(entry.name)
        except OSError:
            continue
    if below:
        shown = ", ".join(below[:6]) + (f" and {len(below) - 6} more" if len(below) > 6 else "")
        raise UsageError(
            f"{uri} is a directory of runs or checkpoints ({shown}), not one checkpoint: name one, e.g. {uri.rstrip('/')}/{below[0]}"
        )


def _classified(storage: Storage, uri: str) -> PathKind:
    """What the path given to verify or seal is; nothing there is nothing to drill, a storage
    that fails to say is a storage error."""
    try:
        return classify(storage, uri)
    except (FileNotFoundError, NotADirectoryError):
        raise NothingToDrill(f"{uri} does not exist") from None
    except OSError as exc:
        raise storage_unavailable(uri, exc) from None


def _run_root(uri: str, found: Discovery) -> UsageError:
    names = [c.name for c in found.checkpoints] or [s.name for s in found.incomplete]
    shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    return UsageError(
        f"{uri} is a run directory holding checkpoints ({shown}), not one checkpoint: name one, e.g. {uri.rstrip('/')}/{names[-1]}"
    )


def _incomplete_finding(save: IncompleteSave) -> Finding:
    return Finding(
        check=NAME,
        code="incomplete-save",
        severity=Severity.ERROR,
        subject=save.uri,
        message=f"{save.name} is an incomplete save ({save.reason}): a resume from it would fail",
        hint="if no save is still running, fall back to the newest complete checkpoint",
    )


def verify_checkpoint(
    uri: str,
    *,
    sample: SampleSpec | None = None,
    require_sealed: bool = False,
    records: Ledger | None = None,
    coverage_days: float = 7.0,
    storage: Storage | None = None,
    key: bytes | None = None,
    allow_classes: tuple[str, ...] = (),
    meanwhile: Callable[[], object] | None = None,
    begun: HeadStart | None = None,
) -> VerifyOutcome:
    """Verify the checkpoint directory (or single checkpoint file) at ``uri`` (with ``key``,
    its seal must be that key's: see :mod:`drill.integrity.keys`; ``allow_classes`` as
    ``--allow-class``: classes a DCP ``.metadata`` may name beyond torch's own).

    ``meanwhile`` is called once, as soon as the checkpoint's files may be hashing on other
    cores (the head start, :mod:`drill.integrity.ahead`) and before anything waits for them: a
    caller's own work that can overlap the hashing instead of following it (``drill verify``
    loads its renderer there — 20 ms of imports, a seventh of verifying 1.2 GB). The
    verification's seconds span it: the workers hash on meanwhile.

    ``begun`` is a head start begun before this call (:func:`drill.integrity.ahead.begin`;
    ``drill verify``'s console script begins one before it loads its command line): taken if
    it is of this checkpoint and the verification is full, stopped in any case by the time
    this returns or raises.

    Raises :class:`~drill.errors.NothingToDrill` when nothing (or an empty directory) is
    there and :class:`~drill.errors.UsageError` for a run directory (naming its checkpoints);
    an incomplete save is a failed verification.
    """
    try:
        with collector_paused():  # a listing, a seal and digests of thousands of files
            return _verify(
                uri,
                sample or SampleSpec("all"),
                require_sealed,
                records,
                coverage_days,
                storage,
                key,
                allow_classes,
                meanwhile,
                begun,
            )
    finally:
        if begun is not None:  # not taken (the path was refused first), or taken and done
            begun.stop()


def _verify(
    uri: str,
    sample: SampleSpec,
    require_sealed: bool,
    records: Ledger | None,
    coverage_days: float,
    storage: Storage | None,
    key: bytes | None,
    allow_classes: tuple[str, ...],
    meanwhile: Callable[[], object] | None = None,
    begun: HeadStart | None = None,
) -> VerifyOutcome:
    named(uri, "drill verify ./run/step-100")
    storage = ListedOnce(storage or storage_for(uri))  # what it is, then its proof: one listing
    uri = storage.normalize(uri)
    started = time.perf_counter()
    with head_start(storage, uri, sample, begun) as ahead:  # the seal's files hash while the path is classified
        if ahead is not None and ahead.listed_apart is not None:
            storage.seed(uri, ahead.listing)  # listed apart while the seal was parsed
        if meanwhile is not None:
            meanwhile()
        what = _classified(storage, uri)
        if what.kind == "file":
            entry = storage.stat(uri)
            result = _verify_file(storage, uri, entry.size)
            return VerifyOutcome(uri=uri, result=result, seconds=time.perf_counter() - started, bytes_hashed=entry.size)
        if what.kind == "run-root":
            raise _run_root(uri, what.discovery)  # type: ignore[arg-type]
        if what.kind == "empty":
            raise NothingToDrill(f"{uri} is an empty directory: no checkpoint to verify")
        if what.kind == "directory":
            _refuse_a_directory_of_runs(storage, uri)
        fmt = what.ref.format if what.ref is not None else None
        try:
            outcome = _verify_directory(
                storage, uri, sample, require_sealed, records, coverage_days, started, key, allow_classes, fmt, ahead
            )
        except (PermissionError, StorageUnavailable) as exc:
            raise storage_unavailable(uri, exc) from None
        if what.kind == "incomplete":
            outcome.result.findings.insert(0, _incomplete_finding(what.incomplete))  # type: ignore[arg-type]
            outcome.result.summary = f"incomplete save; {outcome.result.summary}"
        elif (
            what.kind == "directory"
            and not outcome.result.errors  # a path out of it, a manifest refused: a finding, not "not a checkpoint"
            and outcome.result.evidence.get("evidence_level") != "sealed"
            and not outcome.result.evidence.get("manifests")
        ):
            raise NothingToDrill(
                f"{uri} is not a checkpoint drill recognizes (no .metadata, trainer_state.json, {MANIFEST_NAME} or shard index)"
            )
        return outcome


def _verify_directory(
    storage: Storage,
    uri: str,
    sample: SampleSpec,
    require_sealed: bool,
    records: Ledger | None,
    coverage_days: float,
    started: float,
    key: bytes | None,
    allow_classes: tuple[str, ...] = (),
    fmt: str | None = None,
    ahead: HeadStart | None = None,
) -> VerifyOutcome:
    checkpoint_id = None
    last: dict = {}
    if records is not None and sample.kind == "auto":
        checkpoint_id = _checkpoint_id(records, uri, fmt)
        last = {p: t for p, (t, _) in records.last_verified(checkpoint_id).items()}
    plan = plan_integrity(storage, uri, sample, last, key=key, ahead=ahead)
    observed: dict[str, Observed] = {}
    structure = (
        formats.structure(fmt, storage, plan.checkpoint, plan.on_storage, allow_classes)
        if plan.manifest is None and fmt and not plan.refuse
        else None
    )
    ledger = None
    if records is not None:

        def ledger(update: Any) -> Any:
            return records.apply_coverage(
                checkpoint_id or _checkpoint_id(records, uri, fmt), None, update, coverage_days
            )

    result = prove(
        storage,
        plan,
        observed,
        structure=structure,
        require_sealed=require_sealed,
        ledger=ledger,
        coverage_days=coverage_days,
    )
    hashed = bytes_hashed(plan, observed)
    result.seconds = time.perf_counter() - started
    return VerifyOutcome(uri=uri, result=result, seconds=result.seconds, bytes_hashed=hashed)


def seal(
    uri: str | os.PathLike[str],
    *,
    force: bool = False,
    storage: Storage | None = None,
    key: bytes | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> SealResult:
    """Seal one checkpoint directory (``drill seal``, ``drill.seal``, ``drill.sdk.seal``) —
    never a run directory (a usage error naming its checkpoints), a directory of runs, nor an
    incomplete save (a :class:`SealConflict`): sealed, it would vouch for what is not one
    checkpoint. ``key``: a keyed seal; ``force``: replace a manifest that seals other content."""
    uri = os.fspath(uri)
    named(uri, "drill seal ./run/step-100")
    storage = storage or storage_for(uri)
    uri = storage.normalize(uri)
    what = _classified(storage, uri)
    if what.kind == "file":
        raise UsageError(
            f"{uri} is a single file: drill seals checkpoint directories (a torch.save file carries its own CRC-32s)"
        )
    if what.kind == "directory":
        _refuse_a_directory_of_runs(storage, uri)  # sealed, it would vouch for their files as one checkpoint's
    if what.kind == "run-root":
        raise _run_root(uri, what.discovery)  # type: ignore[arg-type]
    if what.kind == "empty":
        raise NothingToDrill(f"{uri} is an empty directory: nothing to seal")
    if what.kind == "incomplete":
        assert what.incomplete is not None
        raise SealConflict(
            f"{what.incomplete.name} is an incomplete save ({what.incomplete.reason}): sealing it would vouch for a save that never finished"
        )
    try:
        return seal_files(uri, force=force, storage=storage, key=key, chunk_size=chunk_size)
    except PermissionError as exc:  # a file below it the storage will not let drill read
        raise storage_unavailable(uri, exc) from None


def _checkpoint_id(records: Ledger, uri: str, fmt: str | None) -> int:
    name = uri.rstrip("/").rsplit("/", 1)[-1]
    return records.ensure_checkpoint(
        run_root=uri.rstrip("/").rsplit("/", 1)[0], uri=uri, step=step_of(name), format=fmt or "unknown"
    )
