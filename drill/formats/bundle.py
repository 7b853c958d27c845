"""Checkpoints made of whole files — ``torch.save`` archives, safetensors, JSON — each read once.

DeepSpeed, accelerate, torchtune and the Hugging Face Trainer write a checkpoint as a handful
of files, each one part of the state. A format names its files (:class:`Member`: the path, how
it is loaded); this module reads them through the :class:`~drill.storage.Storage` (hashed as
the plan says), proves each one's structure — a safetensors header against the bytes it
describes, a zip archive's central directory and every record's CRC-32, judged by the bytes and
never by the name — and loads it without running anything from it: ``weights_only=True``, or
the inert reader (:mod:`drill.formats.inert`) for files that pickle a library's own classes
(DeepSpeed's loss scaler, accelerate's RNG states). One budget check covers all of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from drill import safe_json
from drill.findings import Finding, Severity
from drill.formats.base import RestoreContext, Structure, check_budget, one_line, read_file
from drill.restore import ItemFailure, RestoreResult
from drill.storage import Storage
from drill.units import decimal

TORCH = "torch"
"""``torch.load(weights_only=True)`` (numpy arrays allowed where the format says so)."""
INERT = "inert"
"""A ``torch.save`` archive read by the inert unpickler: tensors and containers as usual, any
other class an inert stand-in (DeepSpeed's optimizer states, accelerate's RNG states)."""
SAFETENSORS = "safetensors"
JSON = "json"


@dataclass(frozen=True, slots=True)
class Member:
    """One file of a checkpoint and how it is loaded."""

    path: str
    """Relative to the checkpoint."""
    kind: str
    """:data:`TORCH`, :data:`INERT`, :data:`SAFETENSORS` or :data:`JSON`."""
    size: int
    numpy: bool = False
    """Whether its pickle may hold numpy arrays (RNG states): data, not code."""


def file_structure(path: str, view: memoryview, kind: str | None = None) -> list[Finding]:
    """One file's structural proof: the same in ``run`` (as the file is loaded) and ``verify``.
    A file the format reads as a ``torch.save`` archive (``kind`` :data:`TORCH` or
    :data:`INERT`) must be one — the bytes of anything else, a safetensors file renamed or
    garbage, are ``zip-corrupt`` here as they are unloadable in the run; of a file whose kind is
    not known, the bytes say what it is. A JSON file must parse; a file that is neither a zip
    nor safetensors nor JSON proves nothing here."""
    from drill.integrity.structure import NAME, json_structure, safetensors_structure, sniff, zip_structure

    sniffed = sniff(view)
    if kind in (TORCH, INERT) and sniffed != "zip":
        what = "a safetensors file" if sniffed == "safetensors" else f"{len(view)} bytes of something else"
        message = f"{path} is not a torch.save archive ({what}), and its format loads it as one"
        return [Finding(check=NAME, code="zip-corrupt", severity=Severity.ERROR, subject=path, message=message)]
    if sniffed == "zip":
        return zip_structure(view, path)[0]
    if sniffed == "safetensors" or kind == SAFETENSORS or path.endswith(".safetensors"):
        return safetensors_structure(view, path)[0]
    if kind == JSON or path.endswith(".json"):
        return json_structure(view, path)
    return []


def structure(
    storage: Storage,
    uri: str,
    sizes: Mapping[str, int],
    members: Iterable[Member],
    evidence: dict[str, Any] | None = None,
) -> Structure | None:
    """The structural proof of ``members`` (files of the checkpoint at ``uri``) without loading
    them: a listed file that is gone or cannot be read is a finding; None when there is no file."""
    from drill.integrity.reading import describe_read_error, read_whole
    from drill.integrity.structure import NAME

    kinds = {m.path: m.kind for m in members}
    names = sorted(kinds)
    if not names:
        return None
    findings: list[Finding] = []
    for name in names:
        if name not in sizes:
            findings.append(
                Finding(
                    check=NAME, code="file-missing", severity=Severity.ERROR, subject=name, message=f"{name} is missing"
                )
            )
            continue
        try:
            view = read_whole(storage, storage.child(uri, name), sizes[name], hash=False).view
        except (OSError, EOFError) as exc:
            why, _ = describe_read_error(exc)
            findings.append(
                Finding(
                    check=NAME,
                    code="file-unreadable",
                    severity=Severity.ERROR,
                    subject=name,
                    message=f"{name} cannot be read ({why})",
                )
            )
            continue
        findings += file_structure(name, view, kinds[name])
    return findings, {"files": len(names), **(evidence or {})}


Loaded = dict[str, Any]
"""Path → what the file held (only the files that loaded)."""


def read_members(
    storage: Storage, uri: str, members: list[Member], ctx: RestoreContext, result: RestoreResult
) -> tuple[Loaded, list[Finding]]:
    """Read and load every member once, in order; failures are recorded in ``result`` (a file
    that cannot be read, an entry that will not load), never raised. Returns what loaded and
    the structural findings. Refuses, before reading, members that would not fit the budget."""
    check_budget(sum(m.size for m in members if m.kind != JSON), ctx)  # a file holds at most its own bytes
    ctx.progress.phase("read", total_bytes=sum(m.size for m in members))
    loaded: Loaded = {}
    findings: list[Finding] = []
    for member in members:
        view = read_file(storage, uri, member.path, member.size, ctx, result)
        if view is None:
            continue
        started = time.perf_counter()
        try:
            findings += file_structure(member.path, view, member.kind)
            loaded[member.path] = load_member(member, view, ctx, result)
        except Exception as exc:  # noqa: BLE001 - a damaged or hostile file is evidence
            result.failures.append(member_failure(member.path, exc))
        finally:
            result.load_seconds += time.perf_counter() - started
    return loaded, findings


def load_member(member: Member, view: memoryview, ctx: RestoreContext, result: RestoreResult) -> Any:
    from drill.formats.safeload import NUMPY_ARRAYS, load_safetensors, load_torch

    if member.kind == JSON:
        return safe_json.loads(bytes(view))
    if member.kind == SAFETENSORS:
        return load_safetensors(view, ctx.device)
    if member.kind == INERT:
        from drill.formats.inert import load_inert

        obj, stand_ins = load_inert(view, map_location=ctx.device)
        if stand_ins and result.layout is not None:
            result.layout.notes.append(
                f"{member.path}: {', '.join(sorted(stand_ins))} read as inert stand-ins (never constructed)"
            )
        return obj
    return load_torch(view, (*ctx.allow_classes, *(NUMPY_ARRAYS if member.numpy else ())), map_location=ctx.device)


def member_failure(path: str, exc: BaseException) -> ItemFailure:
    from drill.formats.safeload import UnsafePickle, load_failure

    if isinstance(exc, UnsafePickle):
        return ItemFailure(path, path, exc.reason, code="unsafe-pickle")
    if "Weights only" in str(exc):
        code, reason = load_failure(exc)
        return ItemFailure(path, path, reason, code=code)
    return ItemFailure(path, path, f"does not load: {one_line(exc)}", code=getattr(exc, "code", "entry-not-loaded"))


def restore_members(
    storage: Storage,
    uri: str,
    members: list[Member],
    ctx: RestoreContext,
    result: RestoreResult,
    canonical: Callable[[Loaded], dict[str, Any]],
) -> None:
    """Read the members, canonicalize what loaded (``canonical``: path → object becomes the
    canonical view; it may add findings to ``result.structure``) and fill ``result``: state,
    inventory, structure, tallies, items per file."""
    from drill.formats.base import tally
    from drill.formats.canonical import inventory

    loaded, findings = read_members(storage, uri, members, ctx, result)
    result.structure = (findings, {"files": len(members)})  # ``canonical`` may add to it
    started = time.perf_counter()
    try:
        state = canonical(loaded)
    finally:
        result.load_seconds += time.perf_counter() - started
    result.state = state
    ranks = {
        k: n
        for k in state
        if k.split(".")[1:2]
        and k.split(".")[1].startswith("rank_")
        and (n := decimal(k.split(".")[1][len("rank_") :])) is not None
    }
    result.inventory = inventory(state, ranks)
    for f in result.files:
        if f.relative_path in loaded:
            f.items = f.items or 1
    tally(result, state)


__all__ = [
    "INERT",
    "JSON",
    "SAFETENSORS",
    "TORCH",
    "Loaded",
    "Member",
    "file_structure",
    "read_members",
    "restore_members",
    "structure",
]
