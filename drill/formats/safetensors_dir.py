"""A directory of safetensors weights: ``model.safetensors``, or shards and the index that names
them (``model.safetensors.index.json``) — what DCP's ``HuggingFaceStorageWriter`` and
``save_pretrained`` write, and the weights of a torchtune epoch.

The index is written after the shards: shards without it are an unfinished save (and a lone
``model.safetensors`` is no checkpoint: accelerate writes one first, before the rest of its save). Each
shard's header is checked against its bytes, and the index against the headers (every tensor
it places in a shard is in that shard). Weights only: nothing here resumes an optimizer, a
schedule, a data position or the generators — each is a warning that says so.
"""

from __future__ import annotations

import re
from typing import Any

from drill import parts, safe_json
from drill.checkpoints import CheckpointRef, IncompleteSave, step_of
from drill.findings import Finding, Severity
from drill.formats.base import Format, RestoreContext, Structure
from drill.formats.bundle import JSON, SAFETENSORS, Member
from drill.restore import RestoreResult
from drill.storage import Entry, Listing, Storage

INDEX = re.compile(r"^(?:model|pytorch_model)\.safetensors\.index\.json\Z")
SHARD = re.compile(r"^model-(\d{5})-of-(\d{5})\.safetensors\Z")
WEIGHTS_ONLY = "a safetensors checkpoint holds weights only (HuggingFaceStorageWriter, save_pretrained): nothing of it resumes training"


def _finding(code: str, subject: str, message: str) -> Finding:
    return Finding(check="integrity", code=code, severity=Severity.ERROR, subject=subject, message=message)


class SafetensorsDir(Format):
    """Safetensors weights in a step directory (see the module's docstring)."""

    name = "safetensors"
    label = "safetensors weights (DCP's HuggingFaceStorageWriter, save_pretrained)"
    marker = "model.safetensors.index.json"

    def recognize(
        self, storage: Storage, uri: str, name: str, entries: Listing
    ) -> CheckpointRef | IncompleteSave | None:
        index = next((e for e in entries.suffixed(".json") if e.is_file and INDEX.match(e.name)), None)
        if index is not None:
            return CheckpointRef(uri=uri, name=name, step=step_of(name), format=self.name, mtime=index.mtime)
        if (
            any(e.is_file and SHARD.match(e.name) for e in entries.suffixed(".safetensors"))
            and step_of(name) is not None
        ):
            return IncompleteSave(
                uri,
                name,
                step_of(name),
                "safetensors shards but no model.safetensors.index.json, which is written after them: the save never finished",
            )
        return None

    def is_export(self, ref: CheckpointRef, entries: list[Entry]) -> bool:
        return ref.step is None  # save_pretrained's output: a model, not a step's checkpoint

    def structure(
        self, storage: Storage, uri: str, sizes: dict[str, int], allow_classes: tuple[str, ...] = ()
    ) -> Structure | None:
        from drill.formats import bundle
        from drill.integrity.reading import read_whole

        index = next((p for p in sizes if INDEX.match(p)), None)
        weight_map = (
            _weight_map(read_whole(storage, storage.child(uri, index), sizes[index], hash=False).view) if index else {}
        )
        shards = sorted({p for p in sizes if p.endswith(".safetensors") and "/" not in p} | set(weight_map.values()))
        proof = bundle.structure(storage, uri, sizes, [Member(n, SAFETENSORS, sizes.get(n, 0)) for n in shards])
        findings, evidence = proof if proof is not None else ([], {})
        findings = [f for f in findings if f.code != "file-missing"] + self._missing_shards(weight_map, sizes, index)
        if weight_map:
            findings += _against_headers(weight_map, lambda shard: _header(storage, uri, shard, sizes))
        return findings, {**evidence, "index": index, "tensors_indexed": len(weight_map)}

    def restore(self, storage: Storage, ref: CheckpointRef, ctx: RestoreContext) -> RestoreResult:
        from drill.formats.bundle import restore_members

        result = RestoreResult(uri=ref.uri, format=self.name, device=str(ctx.device))
        result.layout = self.layout(ref)
        sizes = {e.name: e.size for e in storage.list(ref.uri) if e.is_file}
        members = self.members(sizes)
        restore_members(
            storage,
            ref.uri,
            members,
            ctx,
            result,
            lambda loaded: self.canonical(loaded, sizes, result, storage, ref, ctx),
        )
        return result

    # -- what a subclass (torchtune) builds on ------------------------------------------------
    def members(self, sizes: dict[str, int]) -> list[Member]:
        index = [Member(p, JSON, n) for p, n in sizes.items() if INDEX.match(p)]
        return index + [Member(p, SAFETENSORS, n) for p, n in sorted(sizes.items()) if p.endswith(".safetensors")]

    def layout(self, ref: CheckpointRef) -> Any:
        from drill.formats.canonical import Layout

        layout = Layout(
            format=self.name,
            required=(parts.MODEL,),
            never_saved={p: WEIGHTS_ONLY for p in parts.CANONICAL_PARTS if p != parts.MODEL},
            recognized="safetensors weights: shards named by model.safetensors.index.json",
            save_hint="the index names a shard that is not there, or the writer saved no weights",
        )
        if ref.step is not None:
            layout.step_counters["directory name"] = ref.step
        return layout

    def canonical(
        self,
        loaded: dict[str, Any],
        sizes: dict[str, int],
        result: RestoreResult,
        storage: Storage,
        ref: CheckpointRef,
        ctx: RestoreContext,
    ) -> dict[str, Any]:
        state: dict[str, Any] = {}
        index = next((p for p in loaded if INDEX.match(p)), None)
        weight_map = _clean_map(loaded.get(index)) if index else {}
        headers: dict[str, set[str]] = {}
        for path, tensors in sorted(loaded.items()):
            if path.endswith(".safetensors") and isinstance(tensors, dict):
                headers[path] = set(tensors)
                state.update({f"{parts.MODEL}.{k}": v for k, v in tensors.items()})
        missing = self._missing_shards(weight_map, sizes, index)
        result.layout.missing_files.update({f.subject: f.message.split(": ", 1)[1] for f in missing if f.subject})
        result.structure[0].extend(missing + _against_headers(weight_map, headers.get))
        result.structure[1]["index"] = index
        return state

    @staticmethod
    def _missing_shards(weight_map: dict[str, str], sizes: dict[str, int], index: str | None) -> list[Finding]:
        return [
            _finding(
                "file-missing",
                shard,
                f"{shard} is missing: {index} places {sum(1 for v in weight_map.values() if v == shard)} tensor(s) in it",
            )
            for shard in sorted(set(weight_map.values()))
            if shard not in sizes
        ]


def _weight_map(view: Any) -> dict[str, str]:
    try:
        return _clean_map(safe_json.loads(bytes(view)))
    except (ValueError, RecursionError):
        return {}


def _clean_map(doc: Any) -> dict[str, str]:
    """The index's tensor → shard map, only names that stay in the directory."""
    wm = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(wm, dict):
        return {}
    return {
        str(k): v
        for k, v in wm.items()
        if isinstance(v, str) and "/" not in v and "\\" not in v and v not in ("", ".", "..")
    }


def _header(storage: Storage, uri: str, shard: str, sizes: dict[str, int]) -> set[str] | None:
    """The tensor names in a shard's header, read from its first bytes alone."""
    import struct

    if shard not in sizes or sizes[shard] < 8:
        return None
    try:
        with storage.open(storage.child(uri, shard)) as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if 8 + n > sizes[shard] or n > 100 << 20:
                return None
            header = safe_json.loads(f.read(n))
    except (OSError, ValueError, struct.error):
        return None
    return {k for k in header if k != "__metadata__"} if isinstance(header, dict) else None


def _against_headers(weight_map: dict[str, str], header_of: Any) -> list[Finding]:
    """Every tensor the index places in a shard is in that shard's header."""
    out = []
    by_shard: dict[str, list[str]] = {}
    for tensor, shard in weight_map.items():
        by_shard.setdefault(shard, []).append(tensor)
    for shard, tensors in sorted(by_shard.items()):
        names = header_of(shard)
        if names is None:
            continue  # missing or unreadable: said already
        absent = sorted(t for t in tensors if t not in names)
        if absent:
            out.append(
                _finding(
                    "index-mismatch",
                    shard,
                    f"the index places {len(absent)} tensor(s) in {shard} that it does not hold ({', '.join(absent[:3])}{'…' if len(absent) > 3 else ''}): a load would fail",
                )
            )
    return out


__all__ = ["INDEX", "SafetensorsDir", "WEIGHTS_ONLY"]
