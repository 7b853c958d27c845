"""Structural proofs for unsealed checkpoints: consistent, though not content-hashed.

- DCP: every storage entry in ``.metadata`` (file, offset, length) lies inside an existing
  file, entries do not overlap, and every byte of every data file belongs to some entry.
- torch.save (zip): the central directory parses and every record's CRC-32 matches.
- safetensors: the header parses and its data offsets tile the file exactly.

Each function returns findings (empty when consistent) and the evidence it examined.
"""

from __future__ import annotations

import json
import math
import re
import struct
import zlib
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from drill import safe_json
from drill.findings import PER_CODE, Finding, Severity
from drill.ranks import absent, counted

NAME = "integrity"


def _finding(code: str, subject: str, message: str, **kw: Any) -> Finding:
    return Finding(
        check=NAME, code=code, severity=kw.pop("severity", Severity.ERROR), subject=subject, message=message, **kw
    )


_SHARD = re.compile(r"^__(\d+)_(\d+)\.distcp\Z")


def unreadable_index(why: str, sizes: Mapping[str, int]) -> tuple[list[Finding], dict[str, Any]]:
    """The structural verdict on a DCP checkpoint whose ``.metadata`` cannot be loaded safely:
    ``run`` and ``verify`` give this same one. The shards are then named from the directory
    listing, so a gap in them is still reported."""
    findings = [_finding("metadata-unreadable", ".metadata", f".metadata cannot be loaded safely: {why}")]
    findings += shard_gaps(sizes)
    return findings, {"data_files": sorted(n for n in sizes if _SHARD.match(n))}


def shard_gaps(sizes: Mapping[str, int]) -> list[Finding]:
    """``__RANK_N.distcp`` files missing from the listing: every rank below the highest one
    present writes as many files as the others (DCP's FileSystemWriter names them so), so a
    missing rank or file number is a missing shard. A lost highest rank cannot be seen here."""
    files: dict[int, set[int]] = defaultdict(set)
    for name in sizes:
        m = _SHARD.match(name)
        if m:
            files[int(m.group(1))].add(int(m.group(2)))
    if not files:
        return []
    numbers = sorted(set().union(*files.values()))
    gone, ranks_gone = absent(files, max(files) + 1)  # rank numbers come from names: counted, never enumerated
    total = ranks_gone * len(numbers) + sum(len(numbers) - len(have) for have in files.values())
    out: list[Finding] = []
    for rank in sorted({*files, *gone}):
        have = files.get(rank, set())
        for n in (n for n in numbers if n not in have):
            if len(out) == PER_CODE - 1:
                return counted(out, total)
            out.append(
                _finding(
                    "file-missing",
                    f"__{rank}_{n}.distcp",
                    f"__{rank}_{n}.distcp is missing: the other ranks' shards show rank {rank} wrote it",
                )
            )
    return counted(out, total)


def side_structure(
    side: Mapping[str, str], sizes: Mapping[str, int], read: Callable[[str], memoryview]
) -> list[Finding]:
    """The files a trainer's layout keeps beside the shards (``side``: name → why it matters):
    present, and — for a ``torch.save`` zip — every record's CRC-32 matching; for JSON, parsing."""
    findings = []
    for name, why in side.items():
        if name not in sizes:
            findings.append(
                _finding("file-missing", name, f"{name} is missing: {why}", expected="present", actual="missing")
            )
            continue
        try:
            data = read(name)
        except OSError as exc:
            findings.append(_finding("file-unreadable", name, f"{name} cannot be read ({exc.strerror or exc}): {why}"))
            continue
        if name.endswith(".json"):
            findings += json_structure(data, name, why)
        elif sniff(data) == "zip":
            findings += zip_structure(data, name)[0]
        else:
            findings.append(_finding("zip-corrupt", name, f"{name} is not a torch.save archive: {why}"))
    return findings


def json_structure(data: memoryview, path: str, why: str = "") -> list[Finding]:
    """A JSON side file (a trainer's state, an index) parses: ``json-corrupt`` when it does not."""
    try:
        safe_json.loads(bytes(data))
    except (ValueError, RecursionError):
        return [_finding("json-corrupt", path, f"{path} is not valid JSON" + (f": {why}" if why else ""))]
    return []


def dcp_structure(storage_data: Mapping[Any, Any], sizes: Mapping[str, int]) -> tuple[list[Finding], dict[str, Any]]:
    """``storage_data`` is DCP ``Metadata.storage_data``; ``sizes`` the files on storage."""
    findings: list[Finding] = []
    spans: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for index, info in storage_data.items():
        spans[info.relative_path].append((int(info.offset), int(info.length), getattr(index, "fqn", str(index))))
    for path, entries in sorted(spans.items()):
        if path not in sizes:
            findings.append(
                _finding("file-missing", path, f"{path} holds {len(entries)} entries but is not in the checkpoint")
            )
            continue
        size = sizes[path]
        entries.sort()
        cursor = 0
        for offset, length, fqn in entries:
            end = offset + length
            if end > size:
                findings.append(
                    _finding(
                        "entry-out-of-bounds",
                        path,
                        f"{fqn} is stored at bytes {offset}..{end} of {path}, which has only {size} bytes: truncated",
                        expected=f">= {end} bytes",
                        actual=size,
                    )
                )
            if offset < cursor:
                findings.append(
                    _finding(
                        "entries-overlap",
                        path,
                        f"{fqn} at byte {offset} overlaps the previous entry (ends at {cursor})",
                    )
                )
            elif offset > cursor:
                findings.append(
                    _finding(
                        "bytes-uncovered",
                        path,
                        f"bytes {cursor}..{offset} of {path} belong to no entry",
                        severity=Severity.WARNING,
                    )
                )
            cursor = max(cursor, end)
        if cursor < size:
            findings.append(
                _finding(
                    "bytes-uncovered",
                    path,
                    f"bytes {cursor}..{size} of {path} belong to no entry (file longer than its metadata says)",
                    expected=cursor,
                    actual=size,
                )
            )
    evidence = {"entries": sum(len(v) for v in spans.values()), "data_files": sorted(spans)}
    return findings, evidence


def zip_structure(data: memoryview, path: str) -> tuple[list[Finding], dict[str, Any]]:
    """A torch.save file: parse the central directory and check every record's CRC-32."""
    import zipfile  # with its compressors' modules: only where a zip is checked

    from drill.views import ViewReader

    try:
        archive = zipfile.ZipFile(ViewReader(data))
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        return [_finding("zip-corrupt", path, f"{path}: the zip central directory is unreadable ({exc})")], {}
    findings = []
    pickled = b""
    with archive:
        infos = archive.infolist()
        for info in infos:
            if info.compress_type != zipfile.ZIP_STORED:  # never inflated: a zip bomb is unbounded
                findings.append(
                    _finding(
                        "zip-record-compressed",
                        path,
                        f"{path}: record {info.filename} is compressed, which torch.save never does: not inflated, not loaded",
                    )
                )
                continue
            try:
                with archive.open(info) as member:
                    crc, keep, blocks = 0, _is_pickle(info.filename), []
                    while block := member.read(1 << 20):
                        crc = zlib.crc32(block, crc)
                        if keep:
                            blocks.append(block)
                    if keep:
                        pickled = b"".join(blocks)
            except (zipfile.BadZipFile, OSError, EOFError) as exc:
                # zipfile checks the CRC itself as the record ends, and raises on a mismatch.
                code = "crc-mismatch" if "CRC" in str(exc) else "zip-record-corrupt"
                findings.append(
                    _finding(code, path, f"{path}: record {info.filename} fails ({exc})", expected=f"{info.CRC:08x}")
                )
                continue
            if crc != info.CRC:
                findings.append(
                    _finding(
                        "crc-mismatch",
                        path,
                        f"{path}: record {info.filename} fails its CRC-32",
                        expected=f"{info.CRC:08x}",
                        actual=f"{crc:08x}",
                    )
                )
    if pickled:
        findings += _code_in(pickled, path)
    return findings, {"records": len(infos)}


def _is_pickle(record: str) -> bool:
    """The archive's pickle: ``<archive name>/data.pkl``, as torch.save names it."""
    return record.count("/") == 1 and record.endswith("/data.pkl")


def _code_in(pickled: bytes, path: str) -> list[Finding]:
    """``pickle-names-code`` when the archive's pickle names code (:func:`drill.safe_pickle.names_code`),
    found without running or constructing anything it names: a file the trainer's own
    ``torch.load(weights_only=False)`` would run code from on resume, bytes intact or not."""
    from drill.safe_pickle import code_named

    named = code_named(pickled)
    if not named:
        return []
    shown = ", ".join(named[:5]) + (f" and {len(named) - 5} more" if len(named) > 5 else "")
    return [
        _finding(
            "pickle-names-code",
            path,
            f"{path}: its pickle names code ({shown}) that a trainer's torch.load would run on resume; nothing was run",
        )
    ]


def safetensors_structure(data: memoryview, path: str) -> tuple[list[Finding], dict[str, Any]]:
    """A safetensors file: header length, JSON header, data offsets tiling the data section."""
    size = len(data)
    if size < 8:
        return [_finding("safetensors-corrupt", path, f"{path} is {size} bytes, too short for a header")], {}
    (header_len,) = struct.unpack("<Q", data[:8])
    if 8 + header_len > size:
        return [
            _finding(
                "safetensors-corrupt", path, f"{path}: header of {header_len} bytes runs past the file ({size} bytes)"
            )
        ], {}
    try:
        header = safe_json.loads(bytes(data[8 : 8 + header_len]))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return [_finding("safetensors-corrupt", path, f"{path}: the header is not JSON")], {}
    data_size = size - 8 - header_len
    try:
        spans = safetensors_spans(header)
    except ValueError as exc:
        return [_finding("safetensors-corrupt", path, f"{path}: {exc}")], {}
    findings = [_finding(code, path, f"{path}: {why}") for code, why in layout_problems(spans, data_size)]
    return findings, {"tensors": len(spans)}


def layout_problems(spans: list[tuple[int, int, str]], data_size: int) -> list[tuple[str, str]]:
    """(finding code, why) for each way a safetensors file's spans are not what safetensors'
    own loader accepts: one after another from 0, none past the data section, covering it all.
    The structural proof and drill's loader ask this one question."""
    out = []
    cursor = 0
    for begin, end, name in sorted(spans):
        if end > data_size:
            out.append(("entry-out-of-bounds", f"{name} ends at {end}, past the data section ({data_size} bytes)"))
        if begin != cursor:
            out.append(
                (
                    "entries-overlap" if begin < cursor else "bytes-uncovered",
                    f"{name} starts at {begin}, expected {cursor}",
                )
            )
        cursor = max(cursor, end)
    if cursor != data_size and not out:
        out.append(("bytes-uncovered", f"tensors cover {cursor} of {data_size} data bytes"))
    return out


def safetensors_spans(header: Any) -> list[tuple[int, int, str]]:
    """(begin, end, name) of every tensor a safetensors header lists; ``ValueError`` when the
    header is not the shape safetensors writes."""
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    spans = []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        offsets = meta.get("data_offsets") if isinstance(meta, dict) else None
        if not (
            isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) and o >= 0 for o in offsets)
        ):
            raise ValueError(f"tensor {name!r} has no valid data_offsets")
        if offsets[1] < offsets[0]:
            raise ValueError(f"tensor {name!r} ends before it begins ({offsets})")
        _check_extent(str(name), meta, offsets[1] - offsets[0])
        spans.append((offsets[0], offsets[1], str(name)))
    return spans


SAFETENSORS_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}  # fmt: skip
"""Bits per element of each safetensors dtype."""


def _check_extent(name: str, meta: dict[str, Any], length: int) -> None:
    """A tensor's shape and dtype need exactly the bytes its offsets give it (as safetensors
    itself requires); ``ValueError`` otherwise. An unknown dtype, or one packed below a byte,
    is taken at its offsets' word."""
    shape = meta.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ValueError(f"tensor {name!r} has no valid shape ({shape!r})")
    bits = SAFETENSORS_BITS.get(meta.get("dtype"))  # type: ignore[arg-type]
    if bits is None or bits % 8:
        return
    need = math.prod(shape) * bits // 8
    if need != length:
        raise ValueError(f"tensor {name!r}: {shape} {meta.get('dtype')} needs {need} bytes, its offsets give {length}")


def sniff(data: memoryview) -> str | None:
    """``zip`` (torch.save), ``safetensors`` or None."""
    if bytes(data[:4]) == b"PK\x03\x04":
        return "zip"
    if len(data) >= 9:
        (n,) = struct.unpack("<Q", data[:8])
        if 0 < n < len(data) and bytes(data[8:9]) == b"{":
            return "safetensors"
    return None


__all__ = [
    "dcp_structure",
    "layout_problems",
    "safetensors_structure",
    "shard_gaps",
    "side_structure",
    "sniff",
    "unreadable_index",
    "json_structure",
    "zip_structure",
]
