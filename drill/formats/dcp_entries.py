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
from dataclasses import dataclass
from typing import Any

import torch

from drill.views import ViewReader

DIRECT_MIN_BYTES = 1 << 20
"""Entries smaller than this are read whole and loaded the ordinary way: a few extra small
reads per entry would cost more than the copy they save."""
TAIL_BYTES = 1 << 16
"""How much of an entry's end is read to find its central directory (torch writes ~0.5 KB)."""

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
        return self.offset == 0 and tuple(reversed(expected)) == self.stride and math.prod(self.size) == self.storage_numel


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

    def readinto(self, b) -> int:  # type: ignore[no-untyped-def, override]
        view = memoryview(b).cast("B")
        n = max(0, min(len(view), self._length - self._pos))
        known = max(0, min(n, self._pos + n - self._tail_start))  # the last `known` bytes are in the tail
        view[: n - known] = bytes(n - known)
        if known:
            start = self._pos + n - known - self._tail_start
            view[n - known : n] = self._tail[start : start + known]
        self._pos += n
        return n


def records(tail: memoryview, length: int) -> dict[str, Record] | None:
    """The zip's records by name (without their ``archive/`` prefix), from its tail; None
    when the tail does not hold a central directory drill can read."""
    try:
        with zipfile.ZipFile(_Sparse(tail, length)) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return None
    out = {}
    for zi in infos:
        name = zi.filename.split("/", 1)[1] if "/" in zi.filename else zi.filename
        out[name] = Record(name, zi.header_offset, zi.file_size, zi.compress_type == zipfile.ZIP_STORED and zi.compress_size == zi.file_size, zi.CRC)
    return out


def data_start(head: memoryview, record: Record) -> int | None:
    """Where a record's data begins, from its local header (None: not a valid header)."""
    at = record.header_offset
    if at + _LOCAL.size > len(head):
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
    if not isinstance(storage, tuple) or not (isinstance(offset, int) and isinstance(size, tuple) and isinstance(stride, tuple)):
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
    try:
        spec = _TensorUnpickler(ViewReader(data_pkl)).load()
    except Exception:  # noqa: BLE001 - anything unusual is loaded the ordinary way
        return None
    return spec if isinstance(spec, TensorSpec) else None
