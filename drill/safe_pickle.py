"""Unpickling checkpoint metadata without executing code from the checkpoint.

A pickle can name any importable callable; loading one from a checkpoint that an attacker
could write is remote code execution. DCP writes its ``.metadata`` with plain ``pickle``, so
drill reads it through an allow-list of the handful of classes that file legitimately holds.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

# (module, name) pairs a DCP .metadata file references (torch 2.4 – 2.13).
DCP_METADATA_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        ("torch.distributed.checkpoint.metadata", n)
        for n in (
            "Metadata",
            "MetadataIndex",
            "BytesStorageMetadata",
            "TensorStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
        )
    }
    | {
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.serialization", "_get_layout"),
        ("torch", "Size"),
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PureWindowsPath"),
        ("collections", "OrderedDict"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
    }
)


class ForbiddenGlobal(pickle.UnpicklingError):
    """The pickle names a callable outside the allow-list; nothing was executed."""

    def __init__(self, module: str, name: str) -> None:
        super().__init__(f"pickle references {module}.{name}, which is not on drill's allow-list")
        self.module = module
        self.name = name


class RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, data: io.BytesIO, allowed: frozenset[tuple[str, str]]) -> None:
        super().__init__(data)
        self._allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._allowed:
            return super().find_class(module, name)
        if module == "torch" and _is_torch_dtype(name):
            return super().find_class(module, name)
        raise ForbiddenGlobal(module, name)


def _is_torch_dtype(name: str) -> bool:
    import torch

    return isinstance(getattr(torch, name, None), torch.dtype)


def restricted_loads(data: bytes, allowed: frozenset[tuple[str, str]] = DCP_METADATA_GLOBALS) -> Any:
    return RestrictedUnpickler(io.BytesIO(data), allowed).load()
