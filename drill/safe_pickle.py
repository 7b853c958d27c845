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
    """``data`` unpickled through the allow-list. (DCP's ``.metadata`` is walked only by code
    that knows its shape, each list once; a pickle a generic walk follows is :func:`bounded`.)"""
    return RestrictedUnpickler(io.BytesIO(data), allowed).load()


# -- what an unpickled object may cost the walks after it ------------------------------------------
class PickleBomb(pickle.UnpicklingError):
    """A pickle whose object, walked, is far larger than its bytes: shared references nested
    on each other (a 1.6 KB file that is 10^30 items to every walk), or nesting no walk can
    follow. Nothing was run; drill refuses to walk it."""

    code = "pickle-bomb"


MAX_NODES = 2_000_000
"""Items a checkpoint's pickle may expand to, walked, beyond :data:`NODES_PER_BYTE` per byte."""
NODES_PER_BYTE = 8
"""A pickle spends at least a byte or two on every item it really holds; a file that walks to
many more items per byte than this is made of shared references."""
MAX_NESTING = 512
"""Containers within containers a checkpoint's pickle may nest (recursive walks bear ~1000)."""


def bounded(obj: Any, size: int) -> Any:
    """``obj`` (unpickled from ``size`` bytes) when every walk of it is bounded by its size:
    :class:`PickleBomb` when walking it — every shared reference walked again, as
    :func:`drill.formats.canonical.flatten`, evidence and reports do — would visit more than
    :data:`MAX_NODES` + :data:`NODES_PER_BYTE` × ``size`` items, or nests deeper than
    :data:`MAX_NESTING`. A reference back to a container on its own path (a cycle) is not
    walked again. Walked without recursion, the walk itself bounded by the budget."""
    budget = MAX_NODES + NODES_PER_BYTE * size
    visited = 0
    on_path: set[int] = set()
    stack: list[tuple[Any, int, bool]] = [(obj, 0, False)]
    while stack:
        node, level, leaving = stack.pop()
        if leaving:
            on_path.discard(id(node))
            continue
        visited += 1
        if visited > budget:
            raise PickleBomb(
                f"its object walks to over {budget:,} items from {size:,} bytes: shared references nested on each other"
            )
        children = _children(node)
        if children is None or id(node) in on_path:
            continue
        if level >= MAX_NESTING:
            raise PickleBomb(f"it nests deeper than {MAX_NESTING} levels")
        on_path.add(id(node))
        stack.append((node, level, True))
        stack.extend((child, level + 1, False) for child in children)
    return obj


def _children(node: Any) -> Any:
    """What a walk of ``node`` goes on into (None: a leaf)."""
    if isinstance(node, (str, bytes, bytearray, int, float, complex, bool)) or node is None:
        return None
    if isinstance(node, dict):
        return [*node.keys(), *node.values()]
    if isinstance(node, (list, tuple, set, frozenset)):
        return node
    if type(node).__module__.startswith("torch") or type(node).__module__.startswith("numpy"):
        return None  # tensors, dtypes, arrays: their bytes, not a graph
    state = getattr(node, "__dict__", None)
    if isinstance(state, dict):
        return [*state.values()]
    slots = [getattr(node, name, None) for cls in type(node).__mro__ for name in getattr(cls, "__slots__", ())]
    return slots or None


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


# -- which globals are code --------------------------------------------------------------------
# A trainer resumes with ``torch.load(weights_only=False)`` (DeepSpeed, accelerate, Megatron and
# Lightning side files): every global its pickle names is imported and called. drill reads those
# files inertly (:mod:`drill.formats.inert`), but a file that names code is still a checkpoint
# that runs code on resume, and that is a finding, not a stand-in.

_STDLIB_DATA: frozenset[tuple[str, str]] = frozenset(
    {("builtins", n) for n in ("set", "frozenset", "slice", "complex", "bytearray", "bytes", "str", "int")}
    | {("builtins", n) for n in ("float", "bool", "list", "dict", "tuple", "range", "object")}
    | {("collections", n) for n in ("OrderedDict", "defaultdict", "deque", "Counter")}
    | {("datetime", n) for n in ("datetime", "date", "time", "timedelta", "timezone")}
    | {("pathlib", n) for n in ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath")}
    | {("copyreg", n) for n in ("_reconstructor", "__newobj__", "__newobj_ex__")}
    | {
        ("argparse", "Namespace"),
        ("types", "SimpleNamespace"),
        ("decimal", "Decimal"),
        ("fractions", "Fraction"),
        ("uuid", "UUID"),
        ("functools", "partial"),
        ("re", "_compile"),
        ("logging", "getLogger"),
        ("_codecs", "encode"),
    }
)
"""The standard library's globals a checkpoint legitimately pickles: plain data and how
objects are rebuilt. Every other global of the standard library is code (``os.system``,
``builtins.eval``, ``subprocess.Popen``, ``logging.FileHandler``, ``builtins.getattr``)."""

_REBUILDERS = ("torch._utils._rebuild_", "numpy.core.multiarray.", "numpy._core.multiarray.")
_LIBRARY_DATA: frozenset[str] = frozenset(
    {
        "torch._tensor._rebuild_from_type_v2",
        "torch.serialization._get_layout",
        "numpy.core.numeric._frombuffer",
        "numpy._core.numeric._frombuffer",
        "numpy.random._pickle.__randomstate_ctor",
        "numpy.random._pickle.__bit_generator_ctor",
        "numpy.random._pickle.__generator_ctor",
    }
)
"""Functions of torch and numpy that rebuild tensors, arrays and RNGs from their bytes."""


def py3_name(module: str, name: str) -> tuple[str, str]:
    """A global as Python 3 names it: pickles of protocol 2 and below (``torch.save``'s) name
    ``__builtin__.set`` and ``copy_reg._reconstructor``, which unpickling maps as here."""
    import _compat_pickle

    if (module, name) in _compat_pickle.NAME_MAPPING:
        return _compat_pickle.NAME_MAPPING[(module, name)]
    return _compat_pickle.IMPORT_MAPPING.get(module, module), name


def names_code(module: str, name: str) -> bool:
    """Whether a pickle's global ``module.name`` is code a trainer's unpickler would run.

    Judged by name, never by importing: of the standard library only plain data is not code; of
    a library drill has already imported (torch, numpy), a function other than torch's and
    numpy's rebuilders is (classes, enums and dtypes are data). A module drill has not imported
    (the trainer's own, DeepSpeed's) cannot be judged without running it, and is not called code.
    """
    import sys

    module, name = py3_name(module, name)
    top = module.partition(".")[0]
    if top in sys.stdlib_module_names:
        return (module, name) not in _STDLIB_DATA
    dotted = f"{module}.{name}"
    if dotted in _LIBRARY_DATA or dotted.startswith(_REBUILDERS) or name.startswith("__pyx_unpickle_"):
        return False  # (Cython's generated unpicklers restore an extension type's fields: numpy's RNGs)
    obj: Any = sys.modules.get(module)
    if obj is None:
        return False
    for part in name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return False
    return callable(obj) and not isinstance(obj, type)


class _Named(dict):
    """What a global becomes while its pickle is scanned: it runs nothing and takes whatever the
    pickle does to an object (items, appends, state) so that the scan reaches the pickle's end."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def __setstate__(self, state: Any) -> None:
        pass

    def append(self, item: Any) -> None:
        pass

    def extend(self, items: Any) -> None:
        pass

    def add(self, item: Any) -> None:
        pass


class _Scanner(pickle.Unpickler):
    def __init__(self, data: io.BytesIO) -> None:
        super().__init__(data)
        self.named: list[tuple[str, str]] = []

    def find_class(self, module: str, name: str) -> Any:
        self.named.append((module, name))
        return type(name, (_Named,), {})

    def persistent_load(self, pid: Any) -> Any:  # a tensor's storage: not read
        return None


def pickled_globals(data: bytes | memoryview) -> list[tuple[str, str]]:
    """Every global a pickle names, in order, found by unpickling it with nothing constructed:
    each global is an empty class, each storage None. A pickle that breaks off yields what it
    named before (whether it loads is the loader's question)."""
    scanner = _Scanner(io.BytesIO(bytes(data)))
    try:
        scanner.load()
    except Exception:  # noqa: BLE001 - damage is judged where the pickle is loaded
        pass
    return scanner.named


def code_named(data: bytes | memoryview) -> list[str]:
    """The globals of a pickle that are code (:func:`names_code`), as ``module.name``, once each."""
    found = [".".join(py3_name(m, n)) for m, n in pickled_globals(data) if names_code(m, n)]
    return list(dict.fromkeys(found))
