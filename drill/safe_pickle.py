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
        # Every rank's save plan, which Megatron-core keeps in .metadata (all_local_plans):
        # torch's own plain data classes.
        ("torch.distributed.checkpoint.planner", n)
        for n in (
            "SavePlan",
            "WriteItem",
            "WriteItemType",
            "TensorWriteData",
            "BytesIOWriteData",
            "LoadPlan",
            "ReadItem",
            "LoadItemType",
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


def with_classes(allow_classes: tuple[str, ...] | list[str]) -> frozenset[tuple[str, str]]:
    """The metadata allow-list plus classes a user allowed (``--allow-class module.Class``)."""
    return DCP_METADATA_GLOBALS | {tuple(c.rsplit(".", 1)) for c in allow_classes if "." in c}  # type: ignore[misc]


def forbidden_hint(exc: BaseException) -> str | None:
    """How to allow the class a refused pickle named, if the writer is trusted."""
    if isinstance(exc, ForbiddenGlobal):
        return (
            f"the file pickles {exc.module}.{exc.name}, which drill does not load by default; if the writer is trusted, "
            f"allow it: --allow-class {exc.module}.{exc.name} (a policy's contract.allow_classes)"
        )
    return None
