"""DCP's index, read without importing ``torch.distributed.checkpoint``.

Importing DCP costs about half a second (it pulls in DTensor, and with it sympy) — as long as
restoring a small checkpoint. drill reads ``.metadata`` through its allow-list unpickler into
these plain mirrors of DCP's own data classes (same names, same fields, same pickled state),
so a single-process restore, ``drill verify`` and the structural checks never import DCP.
Only ``dcp.load`` itself (the SDK's resume, the replay's load into live objects) gets DCP's
real classes, from :func:`drill.safe_pickle.restricted_loads`.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from drill.memory import collector_paused
from drill.safe_pickle import DCP_METADATA_GLOBALS, RestrictedUnpickler

_META = "torch.distributed.checkpoint.metadata"
_PLANNER = "torch.distributed.checkpoint.planner"


@dataclass
class Metadata:
    state_dict_metadata: dict[str, Any]
    planner_data: Any = None
    storage_data: Any = None
    storage_meta: Any = None
    version: str | None = None


@dataclass(frozen=True)
class MetadataIndex:
    fqn: str
    offset: torch.Size | None = None
    index: int | None = field(hash=False, compare=False, default=None)


@dataclass
class ChunkStorageMetadata:
    offsets: torch.Size
    sizes: torch.Size


class _MEM_FORMAT_ENCODING(Enum):
    TORCH_CONTIGUOUS_FORMAT = 0
    TORCH_CHANNELS_LAST = 1
    TORCH_PRESERVE_FORMAT = 2


@dataclass
class TensorProperties:
    dtype: torch.dtype = torch.float32
    layout: Any = None
    requires_grad: bool = False
    memory_format: Any = None
    pin_memory: bool = False

    def __setstate__(self, state: tuple[Any, ...] | dict[str, Any]) -> None:
        if isinstance(state, dict):  # drill's own pickle of it (rank 0 sends the index to the others)
            self.__dict__.update(state)
        else:  # DCP's: (dtype, layout, requires_grad, memory format encoding, pin_memory)
            self.dtype, self.layout, self.requires_grad, self.memory_format, self.pin_memory = state


@dataclass
class TensorStorageMetadata:
    properties: TensorProperties
    size: torch.Size
    chunks: list[ChunkStorageMetadata]


@dataclass
class BytesStorageMetadata:
    pass


@dataclass
class StorageMeta:
    checkpoint_id: Any = None
    save_id: str | None = None
    load_id: str | None = None
    modules: list[str] = field(default_factory=list)


@dataclass
class _StorageInfo:
    relative_path: str
    offset: int
    length: int
    transform_descriptors: Any = None


class LoadItemType(Enum):
    TENSOR = 1
    BYTE_IO = 2


class WriteItemType(Enum):
    TENSOR = 1
    SHARD = 2
    BYTE_IO = 3


class _PlanRecord:
    """Any of DCP's save/load plan classes (Megatron keeps every rank's plan in ``.metadata``):
    kept as plain attributes, never used."""

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, dict):
            self.__dict__.update(state)


def _plan_class(name: str) -> type:
    return type(name, (_PlanRecord,), {"__module__": __name__})


MIRRORS: dict[tuple[str, str], Any] = {
    (_META, "Metadata"): Metadata,
    (_META, "MetadataIndex"): MetadataIndex,
    (_META, "ChunkStorageMetadata"): ChunkStorageMetadata,
    (_META, "TensorProperties"): TensorProperties,
    (_META, "TensorStorageMetadata"): TensorStorageMetadata,
    (_META, "BytesStorageMetadata"): BytesStorageMetadata,
    (_META, "StorageMeta"): StorageMeta,
    (_META, "_MEM_FORMAT_ENCODING"): _MEM_FORMAT_ENCODING,
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _StorageInfo,
    (_PLANNER, "LoadItemType"): LoadItemType,
    (_PLANNER, "WriteItemType"): WriteItemType,
    **{
        (_PLANNER, n): _plan_class(n)
        for n in ("SavePlan", "WriteItem", "TensorWriteData", "BytesIOWriteData", "LoadPlan", "ReadItem")
    },
}


class _MirrorUnpickler(RestrictedUnpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in MIRRORS and (module, name) in self._allowed:
            return MIRRORS[(module, name)]
        return super().find_class(module, name)


def load_metadata(data: bytes, allowed: frozenset[tuple[str, str]] = DCP_METADATA_GLOBALS) -> Any:
    """``.metadata`` into the mirrors above (classes outside ``allowed`` refused).

    The collector is paused meanwhile: the thousands of small objects an index holds would
    otherwise set off a full collection over everything torch imported (≈70 ms here, 40× the
    unpickling itself)."""
    with collector_paused():
        return _MirrorUnpickler(io.BytesIO(data), allowed).load()


def check_metadata(md: Any) -> None:
    """``ValueError`` unless ``md`` has the shape DCP writes: every name a string, every size
    and offset a tuple of non-negative ints, every storage entry a path, offset and length. An
    index from a damaged or hostile file must fail here, not deep inside a check."""
    if type(md).__name__ != "Metadata" or not isinstance(getattr(md, "state_dict_metadata", None), dict):
        raise ValueError(f"holds a {type(md).__name__}, not DCP Metadata")
    for fqn, entry in md.state_dict_metadata.items():
        if not isinstance(fqn, str):
            raise ValueError(f"an entry is named by a {type(fqn).__name__}, not a string")
        if is_tensor(entry):
            _check_tensor(fqn, entry)
        elif not is_bytes(entry):
            raise ValueError(f"{fqn} is described by a {type(entry).__name__}")
    data = md.storage_data if md.storage_data is not None else {}
    if not isinstance(data, dict):
        raise ValueError(f"its storage index is a {type(data).__name__}, not a mapping")
    for index, info in data.items():
        if not isinstance(getattr(index, "fqn", None), str) or not (index.offset is None or _ints(index.offset)):
            raise ValueError(f"a storage key is malformed ({index!r:.80})")
        path, offset, length = (
            getattr(info, "relative_path", None),
            getattr(info, "offset", None),
            getattr(info, "length", None),
        )
        if not isinstance(path, str) or not _ints((offset, length)):
            raise ValueError(f"the storage entry of {index.fqn} is malformed ({info!r:.80})")


def _check_tensor(fqn: str, md: Any) -> None:
    dtype = getattr(getattr(md, "properties", None), "dtype", None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{fqn} has no dtype")
    if not _ints(md.size) or not isinstance(md.chunks, list):
        raise ValueError(f"{fqn} has a malformed size or chunk list")
    for chunk in md.chunks:
        offsets, sizes = getattr(chunk, "offsets", None), getattr(chunk, "sizes", None)
        if (
            offsets is None
            or sizes is None
            or not (_ints(offsets) and _ints(sizes))
            or not len(offsets) == len(sizes) == len(md.size)
        ):
            raise ValueError(f"{fqn} has a malformed chunk")


def _ints(values: Any) -> bool:
    """A tuple (or torch.Size) of non-negative ints."""
    return isinstance(values, tuple) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)


def is_tensor(md: Any) -> bool:
    """A tensor's entry in ``state_dict_metadata`` (mirror or DCP's own class)."""
    return type(md).__name__ == "TensorStorageMetadata"


def is_bytes(md: Any) -> bool:
    return type(md).__name__ == "BytesStorageMetadata"


def is_byte_io(item: Any) -> bool:
    """A read item for a pickled value rather than a tensor (mirror or DCP's own enum)."""
    return getattr(item.type, "name", None) == "BYTE_IO"


@dataclass(frozen=True, slots=True)
class ReadItem:
    """One chunk or value to read: the fields of DCP's ``ReadItem`` drill's reader uses."""

    type: LoadItemType
    storage_index: MetadataIndex
    dest_index: MetadataIndex
    dest_offsets: torch.Size
    storage_offsets: torch.Size
    lengths: torch.Size


def read_items(metadata: Any, files: set[str] | None = None) -> list[ReadItem]:
    """A read item per chunk or value (stored in ``files``, when given), each read whole."""
    data = metadata.storage_data or {}
    items = []
    for fqn, md in metadata.state_dict_metadata.items():
        if is_tensor(md):
            for chunk in md.chunks:
                index = MetadataIndex(fqn, chunk.offsets)
                info = data.get(index)
                if info is not None and (files is None or info.relative_path in files):
                    zeros = torch.Size([0] * len(chunk.sizes))
                    items.append(
                        ReadItem(
                            LoadItemType.TENSOR, index, index, torch.Size(chunk.offsets), zeros, torch.Size(chunk.sizes)
                        )
                    )
        elif is_bytes(md):
            index = MetadataIndex(fqn)
            info = data.get(index)
            if info is not None and (files is None or info.relative_path in files):
                zero = torch.Size([0])
                items.append(ReadItem(LoadItemType.BYTE_IO, index, index, zero, zero, zero))
    return items


def narrow(tensor: torch.Tensor, offsets: Any, lengths: Any) -> torch.Tensor:
    """The view of ``tensor`` at ``offsets`` with ``lengths`` (DCP's chunk addressing)."""
    for dim, (start, length) in enumerate(zip(offsets, lengths, strict=False)):
        if int(start) != 0 or int(length) != tensor.size(dim):
            tensor = tensor.narrow(dim, int(start), int(length))
    return tensor


def element_size(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype`` (asked of the dtype: a load of 20,000 small entries asks
    it for each, and a tensor made to answer costs twenty times as much)."""
    return dtype.itemsize


def chunk_bytes(md: Any, lengths: Any) -> int:
    return math.prod(int(d) for d in lengths) * element_size(md.properties.dtype)


__all__ = [
    "check_metadata",
    "Metadata",
    "MetadataIndex",
    "ReadItem",
    "is_byte_io",
    "is_bytes",
    "is_tensor",
    "load_metadata",
    "narrow",
    "read_items",
]
