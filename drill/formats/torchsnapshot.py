"""torchsnapshot ``Snapshot.take`` directories.

A snapshot is a directory whose ``.snapshot_metadata`` (JSON, written last: the commit) maps
every entry of every rank's app state (``<rank>/<key>/<path>``) to where it lives: a tensor's
raw bytes (``buffer_protocol``) at a byte range of a file (small tensors are batched into
``batched/<uuid>``), a large tensor in chunks, a sharded tensor's shards, an object in a
``torch.save`` file of its own, and ints, floats, strings and bools inline. torchsnapshot
keeps no checksum: unsealed, what can be proven is that every location named is inside the
snapshot and there, every byte range inside its file and exactly the size its dtype and shape
need, and every ``torch.save`` object's archive sound.
"""

from __future__ import annotations

import base64
import math
import posixpath
import re
import struct
from collections.abc import Iterator
from typing import Any

from drill import parts, safe_json
from drill.checkpoints import CheckpointRef, IncompleteSave, step_of
from drill.findings import Finding, Severity
from drill.formats.base import Format, RestoreContext, Structure
from drill.restore import ItemFailure, RestoreResult
from drill.storage import Listing, Storage
from drill.units import decimal

METADATA = ".snapshot_metadata"
MAX_METADATA = 256 << 20
"""A manifest larger than this is refused unread (a 70B model's is a few MB)."""
MAX_DEPTH = 32
"""Nesting deeper than a manifest's (entry, chunk, tensor, shape: five levels) is refused as it is read."""
_PART_NAMES = {
    parts.MODEL: ("model", "module", "net", "network"),
    parts.OPTIMIZER: ("optim", "optimizer", "opt"),
    parts.LR_SCHEDULER: ("lr_scheduler", "scheduler", "sched"),
    parts.DATALOADER: ("dataloader", "data_loader", "loader", "sampler"),
    parts.RNG: ("rng", "rng_state", "rng_states"),
    parts.TRAIN_STATE: ("progress", "train_state", "trainer_state", "state"),
}
_DTYPE = re.compile(r"^torch\.(\w+)\Z")


class TorchSnapshot(Format):
    """torchsnapshot snapshots (see the module's docstring)."""

    name = "torchsnapshot"
    label = "torchsnapshot"
    marker = METADATA

    def recognize(
        self, storage: Storage, uri: str, name: str, entries: Listing
    ) -> CheckpointRef | IncompleteSave | None:
        meta = entries.file(METADATA)
        if meta is not None:
            return CheckpointRef(uri=uri, name=name, step=step_of(name), format=self.name, mtime=meta.mtime)
        dirs = {e.name for e in entries.dirs}
        if "batched" in dirs or (
            "0" in dirs
            and step_of(name) is not None
            and all(decimal(d) is not None or d in ("batched", "sharded") for d in dirs)
        ):
            return IncompleteSave(
                uri,
                name,
                step_of(name),
                f"torchsnapshot writes {METADATA} last, and it is missing: the snapshot never finished",
            )
        return None

    def writers(self, sizes: dict[str, int]) -> list[int]:
        return sorted({r for p in sizes if (r := _rank_of(p)) is not None})

    def structure(
        self, storage: Storage, uri: str, sizes: dict[str, int], allow_classes: tuple[str, ...] = ()
    ) -> Structure | None:
        from drill.integrity.reading import read_whole

        if METADATA not in sizes:
            return None
        doc, findings = _manifest(
            read_whole(storage, storage.child(uri, METADATA), sizes[METADATA], hash=False).view
            if sizes[METADATA] <= MAX_METADATA
            else None
        )
        if doc is None:
            return findings, {"files": 1}
        spans, objects, problems = _layout(doc)
        findings += problems + _spans_against(spans, sizes)
        findings += _objects_structure(
            objects,
            lambda p: read_whole(storage, storage.child(uri, p), sizes[p], hash=False).view if p in sizes else None,
        )
        return findings, {
            "entries": len(doc["manifest"]),
            "files": len({p for p, *_ in spans} | objects),
            "world_size": doc.get("world_size"),
        }

    def restore(self, storage: Storage, ref: CheckpointRef, ctx: RestoreContext) -> RestoreResult:
        """Read the manifest, then every file it names once; tensors are cut from their byte
        ranges onto the device, objects loaded with ``weights_only=True``."""
        from drill.formats.base import read_file

        result = RestoreResult(uri=ref.uri, format=self.name, device=str(ctx.device), index_file=METADATA)
        result.layout = _canonical_layout(ref)
        meta = read_file(storage, ref.uri, METADATA, None, ctx, result)
        doc, findings = _manifest(meta if meta is not None and len(meta) <= MAX_METADATA else None)
        if doc is None:
            result.metadata_error = findings[0].message if findings else f"{METADATA} cannot be read"
            return result
        _restore_entries(storage, ref, ctx, result, doc, findings)
        return result


# -- the manifest ------------------------------------------------------------------------------
def _finding(code: str, subject: str, message: str) -> Finding:
    return Finding(check="integrity", code=code, severity=Severity.ERROR, subject=subject, message=message)


def _manifest(view: Any) -> tuple[dict[str, Any] | None, list[Finding]]:
    if view is None:
        return None, [
            _finding(
                "metadata-unreadable",
                METADATA,
                f"{METADATA} cannot be read (or is over {MAX_METADATA >> 20} MiB): nothing in the snapshot can be located",
            )
        ]
    try:
        doc = safe_json.loads(bytes(view))
    except (ValueError, RecursionError):
        from drill import safe_yaml

        try:  # torchsnapshot reads it as YAML (JSON is YAML): plain data, aliases that do not multiply
            doc = safe_yaml.load(bytes(view), max_depth=MAX_DEPTH)
        except safe_yaml.YamlRefused as exc:
            return None, [_finding("metadata-unreadable", METADATA, f"{METADATA} is {_refused(exc)}")]
    if not isinstance(doc, dict) or not isinstance(doc.get("manifest"), dict):
        return None, [
            _finding(
                "metadata-unreadable",
                METADATA,
                f"{METADATA} is not a torchsnapshot manifest: nothing in the snapshot can be located",
            )
        ]
    return doc, []


def _refused(exc: Any) -> str:
    """Why the metadata was refused, as the rest of a sentence naming it."""
    where = f" (line {exc.line})" if exc.line else ""
    return f"not a manifest drill reads{where}: {exc.why}; nothing in the snapshot can be located"


def _entries(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for key, entry in doc["manifest"].items():
        if isinstance(entry, dict):
            yield str(key), entry


def _tensors(key: str, entry: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], list[int] | None]]:
    """(key, tensor entry, offsets in the whole tensor) of a tensor, a chunked tensor's chunks, a sharded tensor's shards."""
    if entry.get("type") == "Tensor":
        yield key, entry, None
    elif entry.get("type") in ("ChunkedTensor", "ShardedTensor", "DTensor"):
        for piece in entry.get("chunks") or entry.get("shards") or []:
            if isinstance(piece, dict) and isinstance(piece.get("tensor"), dict):
                yield key, piece["tensor"], list(piece.get("offsets") or [])


def _dtype(name: Any) -> Any:
    import torch

    m = _DTYPE.match(str(name))
    dtype = getattr(torch, m.group(1), None) if m else None
    return dtype if isinstance(dtype, torch.dtype) else None


def _safe(location: Any) -> str | None:
    """The location as a path inside the snapshot, or None when it would leave it."""
    if (
        not isinstance(location, str)
        or not location
        or location.startswith("/")
        or "\\" in location
        or "\x00" in location
    ):
        return None
    norm = posixpath.normpath(location)
    return None if norm.startswith("..") or norm == "." else norm


def _shape(value: Any) -> list[int] | None:
    return value if isinstance(value, list) and all(type(d) is int and d >= 0 for d in value) else None


def _beyond_its_pieces(key: str, entry: dict[str, Any], stored: int) -> Finding | None:
    """``metadata-implausible`` when a tensor claims a whole shape its pieces cannot fill, so a
    whole that size is never allocated (10^14 bytes was): a chunked tensor's whole against its
    chunks (every chunk of it is in its entry, as torchsnapshot writes it); a sharded tensor's
    or DTensor's global shape, whose entry holds one rank's shards, against ``stored`` — the
    bytes every raw tensor of the snapshot holds, which no global tensor of it can exceed."""
    kind = entry.get("type")
    if kind not in ("ChunkedTensor", "ShardedTensor", "DTensor") or (whole := _shape(entry.get("shape"))) is None:
        return None
    if kind == "ChunkedTensor":
        held = sum(math.prod(s) for _, t, _ in _tensors(key, entry) if (s := _shape(t.get("shape"))) is not None)
        if math.prod(whole) <= held:
            return None
        return _finding(
            "metadata-implausible",
            key,
            f"{key} claims a {whole} tensor ({math.prod(whole)} elements), and its pieces hold {held}: nothing allocated",
        )
    from drill.formats.dcp_types import element_size  # torch, only for a tensor that claims a shape

    if (dtype := _dtype(entry.get("dtype"))) is None or (need := math.prod(whole) * element_size(dtype)) <= stored:
        return None
    return _finding(
        "metadata-implausible",
        key,
        f"{key} claims a {whole} tensor ({need} bytes), more than every tensor of the snapshot holds ({stored}): nothing allocated",
    )


def _layout(doc: dict[str, Any]) -> tuple[list[tuple[str, int, int, str]], set[str], list[Finding]]:
    """(file, begin, end, entry) spans of raw tensors, the torch.save object files, and what is wrong with the manifest itself."""
    spans, objects, problems = [], set(), []
    for key, entry in _entries(doc):
        if entry.get("type") == "object":
            path = _safe(entry.get("location"))
            if path is None:
                problems.append(_escapes(key, entry))
            else:
                objects.add(path)
            continue
        for name, tensor, _ in _tensors(key, entry):
            path = _safe(tensor.get("location"))
            if path is None:
                problems.append(_escapes(name, tensor))
            elif tensor.get("serializer") == "torch_save":
                objects.add(path)
            elif isinstance(span := _raw_span(name, tensor), Finding):
                problems.append(span)
            else:
                spans.append((path, *span, name))
    stored = _stored(spans)
    problems += [b for key, entry in _entries(doc) if (b := _beyond_its_pieces(key, entry, stored)) is not None]
    return spans, objects, problems + _ranks_beyond_the_world(doc)


def _rank_of(key: str) -> int | None:
    """The rank a manifest key (``<rank>/…``) is filed under, or None where it names none."""
    return decimal(key.split("/", 1)[0])


def _ranks_beyond_the_world(doc: dict[str, Any]) -> list[Finding]:
    """``metadata-implausible`` when the manifest's ``world_size`` is no count of ranks, or an
    entry's key (``<rank>/…``) names no rank below it: torchsnapshot's restore files each entry
    under its rank in a list of ``world_size`` and cannot place such an entry (a rank may have
    none: a replicated entry is kept under rank 0 alone)."""
    world = doc.get("world_size")
    if type(world) is not int or world < 1:
        return [
            _finding(
                "metadata-implausible", METADATA, f"{METADATA} gives world_size {world!r}, which is no count of ranks"
            )
        ]
    outside = [k for k, _ in _entries(doc) if not ((r := _rank_of(k)) is not None and r < world)]
    if not outside:
        return []
    shown = ", ".join(outside[:3]) + (f" and {len(outside) - 3} more" if len(outside) > 3 else "")
    return [
        _finding(
            "metadata-implausible",
            outside[0],
            f"{len(outside)} entr{'y' if len(outside) == 1 else 'ies'} ({shown}) name no rank below the snapshot's "
            f"world_size {world}: torchsnapshot's restore cannot place {'it' if len(outside) == 1 else 'them'}",
        )
    ]


def _stored(spans: list[tuple[str, int, int, str]]) -> int:
    """The bytes the snapshot's raw tensors hold, as its manifest places them."""
    return sum(end - begin for _, begin, end, _ in spans)


def _escapes(name: str, entry: dict[str, Any]) -> Finding:
    return _finding(
        "path-escapes", name, f"{name}: its location {entry.get('location')!r} leads out of the snapshot: never opened"
    )


def _raw_span(name: str, tensor: dict[str, Any]) -> tuple[int, int] | Finding:
    """The byte range a raw tensor's dtype and shape need, or ``metadata-implausible``."""
    from drill.formats.dcp_types import element_size

    dtype, shape, span = _dtype(tensor.get("dtype")), _shape(tensor.get("shape")), tensor.get("byte_range")
    if dtype is None or shape is None:
        return _finding(
            "metadata-implausible",
            name,
            f"{name}: dtype {tensor.get('dtype')!r} or shape {tensor.get('shape')!r} is not a tensor's",
        )
    need = math.prod(shape) * element_size(dtype)
    begin, end = (
        span if isinstance(span, list) and len(span) == 2 and all(isinstance(v, int) for v in span) else (0, need)
    )
    if end - begin != need or begin < 0:
        return _finding(
            "metadata-implausible",
            name,
            f"{name}: {shape} {tensor.get('dtype')} needs {need} bytes, its range is {begin}..{end}",
        )
    return begin, end


def _objects_structure(objects: set[str], view_of: Any) -> list[Finding]:
    """Each torch.save object file's structural proof (``view_of(path)``: its bytes, or None
    when it is not there), held to being an archive: the same in ``run`` and ``verify``."""
    from drill.formats.bundle import TORCH, file_structure

    return [f for p in sorted(objects) if (v := view_of(p)) is not None for f in file_structure(p, v, TORCH)]


def _spans_against(spans: list[tuple[str, int, int, str]], sizes: dict[str, int]) -> list[Finding]:
    out, missing = [], set()
    for path, begin, end, name in spans:
        if path not in sizes:
            if path not in missing:
                missing.add(path)
                out.append(
                    _finding(
                        "file-missing", path, f"{path} is missing: the manifest places {name} (and perhaps more) in it"
                    )
                )
        elif end > sizes[path]:
            out.append(
                _finding(
                    "entry-out-of-bounds",
                    path,
                    f"{name} lies at bytes {begin}..{end} of {path}, which holds only {sizes[path]} bytes: truncated",
                )
            )
    return out


# -- restoring ---------------------------------------------------------------------------------
def _canonical_layout(ref: CheckpointRef) -> Any:
    from drill.formats.canonical import Layout

    layout = Layout(
        format="torchsnapshot",
        # Its RNGState is how a torchsnapshot run resumes its generators: an absent one is damage
        # or a run that cannot resume bit for bit, never read as "this run never saved it".
        required=(parts.MODEL, parts.OPTIMIZER, parts.RNG),
        recommended=(parts.TRAIN_STATE, parts.LR_SCHEDULER, parts.DATALOADER),
        optimizer_keys="index",
        rng_generators=("torch CPU",),
        recognized="torchsnapshot: an app state's entries located by .snapshot_metadata",
        save_hint="put it in the app_state passed to Snapshot.take (a Stateful: its state_dict() is saved; "
        "torchsnapshot.RNGState() for the generators), or pass --allow-missing rng for a run that saves none",
    )
    if ref.step is not None:
        layout.step_counters["directory name"] = ref.step
    return layout


def _restore_entries(
    storage: Storage,
    ref: CheckpointRef,
    ctx: RestoreContext,
    result: RestoreResult,
    doc: dict[str, Any],
    findings: list[Finding],
) -> None:
    import time

    from drill.formats.base import check_budget, read_file, tally
    from drill.formats.canonical import inventory

    spans, objects, problems = _layout(doc)
    files = sorted({p for p, *_ in spans} | objects)
    stored = _stored(spans)
    check_budget(stored + sum(_size(storage, ref, p) for p in objects), ctx)
    ctx.progress.phase("read", total_bytes=None)
    views = {}
    for path in files:
        views[path] = read_file(storage, ref.uri, path, None, ctx, result)
    sizes = {f.relative_path: f.size for f in result.files if f.size is not None}
    started = time.perf_counter()
    state: dict[str, Any] = {}
    for key, entry in _entries(doc):
        _value(key, entry, views, ctx, result, state, stored)
    result.load_seconds += time.perf_counter() - started
    structural = problems + _spans_against(spans, sizes) + _objects_structure(objects, views.get)
    result.structure = (
        findings + structural,
        {"entries": len(doc["manifest"]), "files": len(files), "world_size": doc.get("world_size")},
    )
    result.state = _parts(state, doc)
    result.inventory = inventory(result.state)
    tally(result, result.state)


def _size(storage: Storage, ref: CheckpointRef, path: str) -> int:
    try:
        return storage.stat(storage.child(ref.uri, path)).size
    except OSError:
        return 0


def _value(
    key: str,
    entry: dict[str, Any],
    views: dict[str, Any],
    ctx: RestoreContext,
    result: RestoreResult,
    state: dict[str, Any],
    stored: int,
) -> None:
    """``state[key]`` from its manifest entry (``stored``: as :func:`_beyond_its_pieces`)."""
    kind = entry.get("type")
    if kind in ("int", "float", "bool", "str", "bytes"):
        state[key] = _primitive(kind, entry.get("serialized_value"))
    elif kind == "object":
        state[key] = _object(key, _safe(entry.get("location")), views, ctx, result)
    elif kind in ("Tensor", "ChunkedTensor", "ShardedTensor", "DTensor"):
        tensor = _tensor(key, entry, views, ctx, result, stored)
        if tensor is not None:
            state[key] = tensor


def _primitive(kind: str, text: Any) -> Any:
    try:
        if kind == "int":
            return int(text)
        if kind == "bool":
            return text == "True"
        if kind == "bytes":
            return base64.b64decode(str(text))
        if kind == "float":
            return struct.unpack("<d", base64.b64decode(str(text)))[0]
    except (ValueError, struct.error):
        return None
    return str(text)


def _unread(path: str | None) -> str:
    if path is None:  # named by the path-escapes finding, or absent from the manifest
        return "its location is missing or leads out of the snapshot: never read"
    return f"file {path} could not be read"


def _object(key: str, path: str | None, views: dict[str, Any], ctx: RestoreContext, result: RestoreResult) -> Any:
    from drill.formats.bundle import member_failure

    view = views.get(path) if path is not None else None
    if view is None:
        result.failures.append(ItemFailure(key, path, _unread(path), code="entry-not-loaded"))
        return None
    from drill.formats.safeload import load_torch

    try:
        return load_torch(view, ctx.allow_classes, map_location=ctx.device)
    except Exception as exc:  # noqa: BLE001 - a damaged or hostile object is evidence
        failure = member_failure(path or key, exc)
        result.failures.append(ItemFailure(key, path, failure.reason, failure.code))
        return None


def _tensor(
    key: str, entry: dict[str, Any], views: dict[str, Any], ctx: RestoreContext, result: RestoreResult, stored: int
) -> Any:
    import torch

    pieces = list(_tensors(key, entry))
    whole = None
    if _beyond_its_pieces(key, entry, stored) is not None:  # the manifest's finding names it
        result.failures.append(
            ItemFailure(
                key, None, "its claimed shape holds more than its pieces: not allocated", code="entry-not-loaded"
            )
        )
        return None
    if entry.get("type") != "Tensor":
        dtype, shape = _dtype(entry.get("dtype")), _shape(entry.get("shape"))
        if dtype is not None and shape is not None:
            whole = torch.empty(shape, dtype=dtype, device=ctx.device)
    for name, tensor, offsets in pieces:
        piece = _raw(name, tensor, views, ctx, result)
        if piece is None:
            return None
        if whole is None:
            if offsets is None:
                return piece
            whole = piece  # a sharded tensor of unknown global shape: its first shard
            continue
        if offsets is not None and _shape(offsets) is None:  # a NaN, a negative or a text for an offset
            result.failures.append(
                ItemFailure(
                    key,
                    tensor.get("location"),
                    f"a piece's offsets {offsets!r:.60} are not a tensor's",
                    code="entry-not-loaded",
                )
            )
            return None
        if offsets is not None and len(offsets) == piece.dim():
            try:
                whole[tuple(slice(o, o + s) for o, s in zip(offsets, piece.shape, strict=False))] = piece
            except (RuntimeError, IndexError, TypeError) as exc:
                result.failures.append(
                    ItemFailure(
                        key,
                        tensor.get("location"),
                        f"a piece at {offsets} does not fit the tensor ({exc})",
                        code="entry-not-loaded",
                    )
                )
                return None
    return whole


def _raw(name: str, tensor: dict[str, Any], views: dict[str, Any], ctx: RestoreContext, result: RestoreResult) -> Any:
    import warnings

    import torch

    path = _safe(tensor.get("location"))
    view = views.get(path) if path is not None else None
    if view is None:
        result.failures.append(ItemFailure(name, path, _unread(path), code="entry-not-loaded"))
        return None
    if tensor.get("serializer") == "torch_save":
        return _object(name, path, views, ctx, result)
    dtype, shape, span = _dtype(tensor.get("dtype")), _shape(tensor.get("shape")), tensor.get("byte_range")
    begin, end = span if isinstance(span, list) and len(span) == 2 and _shape(span) is not None else (0, len(view))
    if dtype is None or shape is None or end > len(view) or begin > end:
        result.failures.append(
            ItemFailure(
                name,
                path,
                f"bytes {begin}..{end} of {path} ({len(view)} bytes) do not hold it",
                code="entry-out-of-bounds",
            )
        )
        return None
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            raw = torch.frombuffer(view[begin:end], dtype=dtype) if end > begin else torch.empty(0, dtype=dtype)
        return raw.reshape(shape).to(ctx.device, copy=True)
    except (RuntimeError, ValueError, TypeError) as exc:
        result.failures.append(
            ItemFailure(
                name,
                path,
                f"bytes {begin}..{end} do not make a {shape} {tensor.get('dtype')} tensor ({exc})",
                code="entry-not-loaded",
            )
        )
        return None


def _tree(state: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    """The values back in their containers (the manifest's ``list`` entries as lists), by path."""
    root: dict[str, Any] = {}
    for key, value in state.items():
        node = root
        *heads, leaf = key.split("/")
        for head in heads:
            node = node.setdefault(head, {})
            if not isinstance(node, dict):
                break
        else:
            node[leaf] = value
    lists = {k for k, e in _entries(doc) if e.get("type") == "list"}

    def shaped(node: Any, path: str) -> Any:
        if not isinstance(node, dict):
            return node
        items = {k: shaped(v, f"{path}/{k}" if path else k) for k, v in node.items()}
        if path in lists and all(decimal(k) is not None for k in items):
            return [items[k] for k in sorted(items, key=int)]
        return items

    return shaped(root, "")


def _parts(state: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    """``<rank>/<key>/<path>`` → the canonical view: each app-state key to the part its name
    (or, for an optimizer, its ``param_groups``) says; other ranks' RNG as ``rng.rank_<r>``."""
    from drill.formats.canonical import flatten

    out: dict[str, Any] = {}
    for rank, app in sorted(_tree(state, doc).items()):
        if not isinstance(app, dict):
            continue
        for top, value in app.items():
            part = next((p for p, names in _PART_NAMES.items() if top.lower() in names), None)
            if part is None and isinstance(value, dict) and "param_groups" in value:
                part = parts.OPTIMIZER
            part = part or f"{parts.EXTRA}.{top}"
            if part == parts.RNG and isinstance(value, dict) and set(value) == {"rng_state"}:
                value = {"torch": value["rng_state"]}  # torchsnapshot's RNGState: torch.get_rng_state()
            if part == parts.TRAIN_STATE and isinstance(value, dict):
                value = {
                    ("step" if k in ("iteration", "global_step", "iter_num", "steps") else k): v
                    for k, v in value.items()
                }
            if rank != "0":
                part = f"{part}.rank_{rank}" if part == parts.RNG else f"{parts.EXTRA}.rank_{rank}.{part}"
            flatten(value, part, out)
    return out


__all__ = ["METADATA", "TorchSnapshot"]
