"""Where a DCP tensor entry's bytes are, so they can be read straight into their target.

Each tensor in a ``.distcp`` file is a small ``torch.save`` zip: ``data.pkl`` (how to rebuild
the tensor), a few tiny records, ``data/<key>`` (the raw storage, uncompressed), then the
central directory. Its local headers carry no sizes (zip data descriptors), so the layout is
read from the central directory at the entry's end. Reading the raw storage directly into the
target tensor makes the restore one copy from the page cache to the tensor — no file buffer,
no intermediate tensor, and no memory map (a file truncated while mapped kills the reader with
SIGBUS).

``data.pkl`` is read by a restricted unpickler that only understands a plain tensor: a storage
reference and ``torch._utils._rebuild_tensor_v2``. Anything else — a parameter subclass,
quantized or sparse tensors, a custom class — is not read in place: the caller loads that entry
the ordinary way, through ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import io
import math
import pickle
import struct
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

DIRECT_MIN_BYTES = 1 << 20
"""Entries smaller than this are read whole and loaded the ordinary way: a few extra small
reads per entry would cost more than the copy they save."""
TAIL_BYTES = 1 << 16
"""How much of an entry's end is read to find its central directory (torch writes ~0.5 KB)."""
TAIL_FIRST = 4 << 10
"""How much of it is read first (:func:`tail_records`): enough for torch's directory; the
whole :data:`TAIL_BYTES` only where that does not hold one."""

_LOCAL = struct.Struct("<4sHHHHHIIIHH")


@dataclass(frozen=True, slots=True)
class Record:
    name: str
    header_offset: int
    size: int
    stored: bool
    crc: int


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """The tensor a ``data.pkl`` describes, without its bytes."""

    key: str
    dtype: torch.dtype
    storage_numel: int
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]

    @property
    def contiguous(self) -> bool:
        expected, acc = [], 1
        for dim in reversed(self.size):
            expected.append(acc)
            acc *= dim
        return (
            self.offset == 0 and tuple(reversed(expected)) == self.stride and math.prod(self.size) == self.storage_numel
        )


class _Sparse(io.RawIOBase):
    """An entry of ``length`` bytes of which only the tail is known (zipfile only reads the
    end of an archive to list it); everything else reads as zeros."""

    def __init__(self, tail: memoryview, length: int) -> None:
        super().__init__()
        self._tail, self._length, self._pos = tail, length, 0
        self._tail_start = length - len(tail)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(b).cast("B")
        n = max(0, min(len(view), self._length - self._pos))
        known = max(0, min(n, self._pos + n - self._tail_start))  # the last `known` bytes are in the tail
        view[: n - known] = bytes(n - known)
        if known:
            start = self._pos + n - known - self._tail_start
            view[n - known : n] = self._tail[start : start + known]
        self._pos += n
        return n


_EOCD = struct.Struct("<4s4H2LH")
"""End of central directory: signature, disk numbers, entry counts, directory size and offset, comment length."""
_CENTRAL = struct.Struct("<4s6H3L5H2L")
"""A central directory header: signature, versions, flags, method, time, date, CRC-32, sizes,
name/extra/comment lengths, disk, attributes, local header offset."""
_ZIP64 = 0xFFFFFFFF
_END64 = struct.Struct("<4sQ2H2L4Q")
_LOCATOR = struct.Struct("<4sLQL")
_ZIP64_TAIL = _END64.size + _LOCATOR.size
"""A zip64 end record (no extensible data) and its locator, between the directory and the end record."""


def records(tail: memoryview, length: int) -> dict[str, Record] | None:
    """The zip's records by name (without their ``archive/`` prefix), from its tail; None
    when the tail does not hold a central directory drill can read. The plain zips torch.save
    writes are read straight from their central directory; anything else (zip64, bytes before
    the archive, a comment) by ``zipfile``."""
    plain = _plain_directory(tail, length)
    if plain is not None:
        return plain
    try:
        with zipfile.ZipFile(_Sparse(tail, length)) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return None
    out = {}
    for zi in infos:
        name = zi.filename.split("/", 1)[1] if "/" in zi.filename else zi.filename
        out[name] = Record(
            name,
            zi.header_offset,
            zi.file_size,
            zi.compress_type == zipfile.ZIP_STORED and zi.compress_size == zi.file_size,
            zi.CRC,
        )
    return out


def tail_records(peek: Callable[[int, int], memoryview], length: int) -> dict[str, Record] | None:
    """The records of an entry of ``length`` bytes from its tail, read with ``peek(offset, n)``
    (offsets within the entry): its last :data:`TAIL_FIRST` bytes first, the last
    :data:`TAIL_BYTES` where those do not hold a directory drill can read (:func:`records`).
    A 64 KiB read for each of a checkpoint's entries was 2 ms of a 0.3 GB load."""
    for n in (min(length, TAIL_FIRST), min(length, TAIL_BYTES)):
        found = records(peek(length - n, n), length)
        if found is not None or n == length:
            return found
    return None


def _plain_directory(tail: memoryview, length: int) -> dict[str, Record] | None:
    """The records of a zip whose end record closes the entry with no comment and whose
    directory sits right before it, every value within 32 bits; None for anything else."""
    end = len(tail) - _EOCD.size  # where the end record begins, within the tail
    if end < 0:
        return None
    sig, disk, cd_disk, n_here, n_total, cd_size, cd_offset, comment = _EOCD.unpack_from(tail, end)
    if end >= _ZIP64_TAIL and bytes(tail[end - 20 : end - 16]) == b"PK\x06\x07":
        # torch.save adds a zip64 end record and its locator: they must repeat the values exactly
        _, z_size, _, _, z_disk, z_cd_disk, z_here, z_total, z_cd_size, z_cd_offset = _END64.unpack_from(
            tail, end - _ZIP64_TAIL
        )
        _, l_disk, l_at, l_disks = _LOCATOR.unpack_from(tail, end - 20)
        end -= _ZIP64_TAIL
        record = (
            bytes(tail[end : end + 4]),
            z_size,
            z_disk,
            z_cd_disk,
            z_here,
            z_total,
            z_cd_size,
            z_cd_offset,
            l_disk,
            l_at,
            l_disks,
        )
        if record != (b"PK\x06\x06", 44, 0, 0, n_here, n_total, cd_size, cd_offset, 0, length - len(tail) + end, 1):
            return None
    start = end - cd_size  # where the directory begins, within the tail
    if (
        sig != b"PK\x05\x06"
        or comment
        or disk
        or cd_disk
        or n_here != n_total
        or start < 0
        or cd_offset != length - len(tail) + start
    ):
        return None
    out: dict[str, Record] = {}
    at = start
    for _ in range(n_total):
        if at + _CENTRAL.size > end:
            return None
        (sig, _, _, flags, method, _, _, crc, csize, usize, nlen, elen, clen, _, _, _, offset) = _CENTRAL.unpack_from(
            tail, at
        )
        name_at = at + _CENTRAL.size
        at = name_at + nlen + elen + clen
        if sig != b"PK\x01\x02" or at > end or _ZIP64 in (csize, usize, offset):
            return None
        try:
            name = bytes(tail[name_at : name_at + nlen]).decode("utf-8" if flags & 0x800 else "cp437")
        except UnicodeDecodeError:
            return None
        name = name.split("/", 1)[1] if "/" in name else name
        out[name] = Record(name, offset, usize, method == 0 and csize == usize, crc)
    return out if at == end else None


def data_start(head: memoryview, record: Record) -> int | None:
    """Where a record's data begins, from its local header (None: not a valid header)."""
    at = record.header_offset
    if at < 0 or at + _LOCAL.size > len(head):
        return None
    sig, _, _, method, _, _, _, _, _, nlen, elen = _LOCAL.unpack_from(head, at)
    if sig != b"PK\x03\x04" or method != 0:
        return None
    return at + _LOCAL.size + nlen + elen


def local_header_end(record: Record) -> int:
    """Bytes of the entry to read before :func:`data_start` can be known (the fixed header)."""
    return record.header_offset + _LOCAL.size


_STORAGES: dict[str, torch.dtype] = {
    "DoubleStorage": torch.float64,
    "FloatStorage": torch.float32,
    "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
    "ShortStorage": torch.int16,
    "CharStorage": torch.int8,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
    "ComplexFloatStorage": torch.complex64,
    "ComplexDoubleStorage": torch.complex128,
}
"""The legacy typed-storage class names ``torch.save`` pickles, and the dtypes they hold."""


def _storage_dtype(name: str) -> torch.dtype | None:
    return _STORAGES.get(name)


class _StorageRef:
    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype


def _rebuild(storage: Any, offset: int, size: tuple[int, ...], stride: tuple[int, ...], *rest: Any) -> TensorSpec:
    if not isinstance(storage, tuple) or not (
        isinstance(offset, int) and isinstance(size, tuple) and isinstance(stride, tuple)
    ):
        raise pickle.UnpicklingError("not a plain tensor")
    key, dtype, numel = storage
    return TensorSpec(key, dtype, numel, offset, tuple(int(s) for s in size), tuple(int(s) for s in stride))


class _TensorUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if module == "torch" and (dtype := _storage_dtype(name)) is not None:
            return _StorageRef(dtype)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a plain tensor")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _StorageRef)):
            raise pickle.UnpicklingError("not a storage reference")
        _, ref, key, _location, numel = pid
        if not isinstance(key, str) or not isinstance(numel, int) or numel < 0:
            raise pickle.UnpicklingError("malformed storage reference")
        return (key, ref.dtype, numel)


def tensor_spec(data_pkl: memoryview) -> TensorSpec | None:
    """The plain tensor ``data.pkl`` rebuilds, or None when it is anything else."""
    try:  # a copy into BytesIO: the unpickler reads a raw stream a few bytes per call
        spec = _TensorUnpickler(io.BytesIO(data_pkl.tobytes())).load()
    except Exception:  # noqa: BLE001 - anything unusual is loaded the ordinary way
        return None
    return spec if isinstance(spec, TensorSpec) else None
