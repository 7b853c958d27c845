"""Putting a restored DCP checkpoint into the canonical view of its trainer's layout: keys
renamed (see :mod:`drill.formats.layouts`), the side files the layout keeps beside the shards
(``common.pt``, ``meta.pt``, ``metadata.json``) read — hashed like every file — and checked."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from drill import parts, safe_json
from drill.checkpoints import CheckpointRef
from drill.findings import Finding
from drill.formats.base import RestoreContext, read_file
from drill.formats.layouts import SIDE_FILES, Recognized, canonical_items, optimizer_params, recognize, side_items
from drill.formats.safeload import UnsafePickle
from drill.restore import ItemFailure, RestoreResult, TensorInfo
from drill.storage import Storage


def _names(storage: Storage, uri: str) -> set[str]:
    try:
        return {e.name for e in storage.list(uri)}
    except OSError:
        return set()


def apply_layout(result: RestoreResult, storage: Storage, ref: CheckpointRef, ctx: RestoreContext) -> Recognized:
    """Recognise the layout, canonicalise the state, read the side files; returns what was recognised."""
    names = _names(storage, ref.uri)
    keys = set(result.state) | {i.key for i in result.inventory}
    rec = recognize(keys, names, ref.name)
    rename = _renamer(rec)
    state: dict[str, Any] = {}
    for key, value in result.state.items():
        state.update(canonical_items(key, value, rec))
    result.inventory = [TensorInfo(rename(i.key), i.shape, i.dtype, i.nbytes, i.rank) for i in result.inventory]
    result.failures = [ItemFailure(rename(f.key), f.relative_path, f.reason, f.code) for f in result.failures]
    if result.finite is not None:
        result.finite = {rename(k): v for k, v in result.finite.items()}
    for name in rec.side_files:
        if name in names:
            state.update(_side(name, storage, ref, ctx, result, rec))
    result.state = state
    _describe(result, rec, names)
    return rec


def _renamer(rec: Recognized) -> Any:
    def rename(key: str) -> str:
        return next((k for k, _ in canonical_items(key, None, rec)), key)

    return rename


def _side(
    name: str, storage: Storage, ref: CheckpointRef, ctx: RestoreContext, result: RestoreResult, rec: Recognized
) -> dict[str, Any]:
    """One side file, read once (hashed as the plan says) and loaded without running its pickles."""
    view = read_file(storage, ref.uri, name, None, ctx, result)
    if view is None:
        return {}
    try:
        if name.endswith(".json"):
            safe_json.loads(bytes(view))
            return {}
        from drill.formats.inert import load_inert

        obj, stand_ins = load_inert(view)
    except UnsafePickle as exc:
        result.failures.append(ItemFailure(name, name, exc.reason, code="unsafe-pickle"))
        return {}
    except Exception as exc:  # noqa: BLE001 - a damaged side file is a finding, not a crash
        from drill.formats.base import one_line

        result.failures.append(
            ItemFailure(
                name,
                name,
                f"not a loadable torch.save file ({one_line(exc)})",
                code=getattr(exc, "code", "entry-not-loaded"),
            )
        )
        return {}
    if stand_ins:
        result.layout.notes.append(
            f"{name}: {', '.join(sorted(stand_ins))} read as inert stand-ins (never constructed)"
        )
    result.files[-1].items = 1
    return dict(side_items(name, obj, rec))


def _describe(result: RestoreResult, rec: Recognized, names: set[str]) -> None:
    layout = result.layout
    layout.recognized = f"{rec.name}: {rec.how}"
    layout.never_saved = dict(rec.never_saved)
    layout.loader_shuffles = rec.loader_shuffles
    layout.scheduler_per_step = rec.scheduler_per_step
    if rec.required is not None:
        layout.recommended = tuple(p for p in layout.required if p not in rec.required)
        layout.required = rec.required
    layout.required = tuple(p for p in layout.required if p not in rec.never_saved)
    layout.params = frozenset(
        f"{parts.MODEL}.{p}" if not p.startswith(parts.MODEL + ".") else p for p in optimizer_params(result.state)
    )
    layout.side_files = tuple(rec.side_files)
    layout.missing_files = {n: SIDE_FILES[n] for n in rec.side_files if n not in names}
    if rec.facts is not None:
        rec.facts(layout)


def structure(
    storage: Storage, uri: str, sizes: Mapping[str, int], allow_classes: tuple[str, ...] = ()
) -> tuple[list[Finding], dict[str, Any]] | None:
    """The structural proof of an unsealed DCP checkpoint read from its ``.metadata`` alone
    (``drill verify``): the one :func:`unsealed_structure` gives ``drill run``."""
    from drill.formats.base import one_line
    from drill.formats.dcp_index import claimed_bytes
    from drill.formats.dcp_types import check_metadata, load_metadata
    from drill.integrity.reading import read_whole
    from drill.safe_pickle import with_classes

    if ".metadata" not in sizes:
        return None
    try:
        data = read_whole(storage, storage.child(uri, ".metadata"), sizes[".metadata"], hash=False).view.tobytes()
        metadata = load_metadata(data, with_classes(allow_classes))
        check_metadata(metadata)
        storage_data = metadata.storage_data or {}
    except Exception as exc:  # noqa: BLE001 - an unreadable index is the finding
        return unsealed_structure(storage, uri, sizes, None, f".metadata does not unpickle safely: {one_line(exc)}")
    findings, evidence = unsealed_structure(storage, uri, sizes, storage_data)
    try:  # what the loader refuses before it allocates, the proof refuses too
        claimed_bytes(metadata, dict(sizes))
    except ValueError as exc:
        findings.insert(0, implausible(str(exc)))
    return findings, evidence


def implausible(why: str) -> Finding:
    """An index whose claims the files beside it cannot hold: the loader refuses it before it
    allocates (``metadata-implausible``), and so does the structural proof."""
    from drill.findings import Severity
    from drill.integrity.structure import NAME

    return Finding(
        check=NAME,
        code="metadata-implausible",
        severity=Severity.ERROR,
        subject=".metadata",
        message=f".metadata claims what its files cannot hold: {why}",
    )


def unsealed_structure(
    storage: Storage,
    uri: str,
    sizes: Mapping[str, int],
    storage_data: Mapping[Any, Any] | None,
    why_unreadable: str = "",
) -> tuple[list[Finding], dict[str, Any]]:
    """The structural verdict on an unsealed DCP checkpoint — the one ``run`` and ``verify``
    both give: ``.metadata`` against the files (or, when it cannot be read, the shards named
    from the listing), and the files the recognised layout keeps beside the shards."""
    from drill.integrity.reading import read_whole
    from drill.integrity.structure import dcp_structure, side_structure, unreadable_index

    if storage_data is not None:
        findings, evidence = dcp_structure(storage_data, sizes)
    else:
        findings, evidence = unreadable_index(why_unreadable, sizes)
    keys = {getattr(index, "fqn", str(index)) for index in (storage_data or {})}
    rec = recognize(keys, set(sizes), uri.rstrip("/").rsplit("/", 1)[-1])
    side = {name: SIDE_FILES[name] for name in rec.side_files}
    findings += side_structure(
        side, sizes, lambda name: read_whole(storage, storage.child(uri, name), sizes[name], hash=False).view
    )
    evidence["layout"] = rec.name
    return findings, evidence


__all__ = ["apply_layout", "structure", "unsealed_structure"]
