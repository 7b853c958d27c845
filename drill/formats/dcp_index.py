"""The DCP index: what ``.metadata`` says, before a byte of data is read.

Every tensor's shape and dtype, the targets a resume would allocate, the ranks that saved the
checkpoint, the size of each data file the index names and the bytes the restore will claim —
shared by a whole restore (:mod:`drill.formats.dcp_read`) and one rank's share of it
(:mod:`drill.formats.dcp_shard`).
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch

from drill.formats.dcp_types import element_size, is_bytes, is_tensor
from drill.restore import TensorInfo
from drill.storage import Storage

_SHARD_FILE = re.compile(r"^__(\d+)_\d+\.distcp\Z")


def skeleton(metadata: Any, device: torch.device) -> dict[str, Any]:
    """Targets for every entry in the checkpoint, allocated on ``device`` as a resume would."""
    state: dict[str, Any] = {}
    for fqn, md in metadata.state_dict_metadata.items():
        if is_tensor(md):
            state[fqn] = torch.empty(md.size, dtype=md.properties.dtype, device=device)
        elif is_bytes(md):
            state[fqn] = None
    return state


def inventory(metadata: Any) -> list[TensorInfo]:
    """Every tensor from the index alone: nothing materialized."""
    return [
        TensorInfo(
            fqn,
            tuple(md.size),
            str(md.properties.dtype).replace("torch.", ""),
            md.size.numel() * element_size(md.properties.dtype),
        )
        for fqn, md in metadata.state_dict_metadata.items()
        if is_tensor(md)
    ]


def saved_ranks(metadata: Any) -> list[int]:
    """The ranks that wrote the checkpoint, from DCP's ``__<rank>_<n>.distcp`` file names."""
    names = {info.relative_path for info in (metadata.storage_data or {}).values()}
    return sorted({int(m.group(1)) for n in names if (m := _SHARD_FILE.match(n))})


def file_sizes(storage: Storage, uri: str, metadata: Any) -> dict[str, int]:
    """The size of each data file the index names that exists (missing ones are the reader's finding)."""
    sizes = {}
    for rel in {info.relative_path for info in (metadata.storage_data or {}).values()}:
        try:
            sizes[rel] = storage.stat(storage.child(uri, rel)).size
        except OSError:
            continue
    return sizes


def claimed_bytes(metadata: Any, sizes: dict[str, int]) -> int:
    """Bytes the restored tensors will occupy, once the index is shown to be plausible: every
    chunk is no larger than the entry that stores it, and the entries fit their files.
    ``ValueError`` otherwise — before a byte is allocated (a forged index claiming a
    2^40-element tensor must not make drill ask for 4 TiB)."""
    total = 0
    data = metadata.storage_data or {}
    for info in data.values():
        size = sizes.get(info.relative_path)
        if size is not None and int(info.offset) + int(info.length) > size and int(info.length) > size:
            raise ValueError(
                f"an entry of {int(info.length)} bytes is larger than its whole file {info.relative_path} ({size} bytes)"
            )
    key = type(next(iter(data))) if data else None  # the index's own MetadataIndex class (a mirror or DCP's)
    for fqn, md in metadata.state_dict_metadata.items():
        if not is_tensor(md):
            continue
        item = element_size(md.properties.dtype)
        if any(int(d) < 0 for d in md.size):
            raise ValueError(f"{fqn} has a negative dimension {tuple(md.size)}")
        for chunk in md.chunks:
            need = math.prod(int(d) for d in chunk.sizes) * item
            info = data.get(key(fqn, chunk.offsets)) if key is not None else None
            if info is None:
                raise ValueError(f"{fqn}: a chunk at {tuple(chunk.offsets)} has no storage entry")
            if need > int(info.length):
                raise ValueError(
                    f"{fqn}: a chunk of {need} bytes ({tuple(chunk.sizes)}) claims more than its {int(info.length)}-byte entry"
                )
            total += need
    return total
