"""Reading a trainer's side file (Megatron's ``common.pt``, Lightning's ``meta.pt``) without
running anything it names.

These files pickle the whole resume state beside the tensor shards — iteration, schedulers,
loop progress — and also the trainer's own objects (an ``argparse.Namespace`` of arguments
holding enums of the trainer's modules, callback states). ``torch.load(weights_only=True)``
refuses the lot. :func:`load_inert` reads them with an unpickler that builds tensors, arrays and
containers as usual and turns every other class into an inert :class:`StandIn` that only
records what it was given: the numbers drill checks come out intact, and no constructor,
``__setstate__`` or ``__reduce__`` of the file's choosing ever runs. A global that is code
(:func:`drill.safe_pickle.names_code`: ``os.system``, ``builtins.getattr``, ``torch.load``) is
not stood in for but refused (:class:`~drill.formats.safeload.UnsafePickle`): the trainer's own
``torch.load(weights_only=False)`` would run it on resume, so the file is an ``unsafe-pickle``.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch

from drill.formats.safeload import UnsafePickle
from drill.safe_pickle import bounded, names_code, py3_name

SAFE = {
    ("collections", "OrderedDict"),
    ("collections", "defaultdict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
    ("builtins", "complex"),
    ("builtins", "bytearray"),
    ("torch", "Size"),
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_tensor"),
    ("torch._utils", "_rebuild_parameter"),
    ("torch._utils", "_rebuild_parameter_with_state"),
    ("torch.serialization", "_get_layout"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),  # how protocol 2 pickles bytes (numpy's dtype and RNG states)
}


class StandIn:
    """What an unknown class in the file became: its name, and what the pickle passed it."""

    __slots__ = ("args", "kind", "state")

    kind: str

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.state: Any = kwargs or None

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"<{self.kind} (not loaded)>"

    @property
    def fields(self) -> dict[str, Any]:
        """The attributes a plain object (an ``argparse.Namespace``) was saved with."""
        return dict(self.state) if isinstance(self.state, dict) else {}


def _rebuild_from_type(func: Any, new_type: Any, args: Any, state: Any) -> Any:
    """How torch pickles a tensor of a subclass (DeepSpeed's ZeRO-3 flat partitions): the plain
    tensor, rebuilt by the one callable the pickle names — only ever one of :data:`SAFE`'s own
    (anything else the unpickler handed back is an inert stand-in) — and never converted to the
    subclass the file names, nor given its state."""
    if getattr(func, "__module__", None) != "torch._utils" or not isinstance(args, tuple):
        return StandIn(func, new_type, args, state)
    return func(*args)


def _stand_in(module: str, name: str, seen: set[str]) -> type:
    kind = f"{module}.{name}"
    seen.add(kind)
    return type(name, (StandIn,), {"__slots__": (), "kind": kind, "__module__": "drill.formats.inert"})


class _Module:
    """A ``pickle_module`` for :func:`torch.load` whose unpickler never imports a callable
    outside :data:`SAFE` (torch's storage classes and dtypes aside)."""

    def __init__(self, seen: set[str]) -> None:
        seen_ = seen

        class Unpickler(pickle.Unpickler):
            def find_class(self, module: str, name: str) -> Any:
                module, name = py3_name(module, name)  # torch.save's protocol 2 names __builtin__.set
                if (module, name) in SAFE or (
                    module == "torch"
                    and (name.endswith("Storage") or isinstance(getattr(torch, name, None), torch.dtype))
                ):
                    return super().find_class(module, name)
                if module == "numpy.dtypes" and name.endswith("DType"):  # never a prefix: numpy_evil is not numpy
                    return super().find_class(module, name)
                if (module, name) == ("torch._tensor", "_rebuild_from_type_v2"):
                    return _rebuild_from_type
                if names_code(module, name):  # what the trainer's own torch.load would run
                    raise UnsafePickle(f"{module}.{name}", code=True)
                return _stand_in(module, name, seen_)

        self.Unpickler = Unpickler
        # torch's legacy (pre-zip) reader calls pickle_module.load directly: it must be just as
        # restricted, or a bare pickle would run before any class is looked up.
        self.load = lambda f, **kwargs: Unpickler(f, **kwargs).load()
        self.__name__ = "drill.formats.inert"


def load_inert(data: bytes | memoryview, map_location: Any = "cpu") -> tuple[Any, set[str]]:
    """The file's object, and the classes that became :class:`StandIn` instead of running;
    :class:`~drill.safe_pickle.PickleBomb` for one no walk of it could finish."""
    from drill.formats.safeload import check_archive

    seen: set[str] = set()
    if bytes(data[:4]) != b"PK\x03\x04":
        raise ValueError("not a torch.save zip archive (side files are written with torch.save's default format)")
    check_archive(memoryview(data))  # no code torch.load would hand to torch.jit.load, no zip bomb
    # weights_only=False hands unpickling to the pickle_module: drill's own allow-list above.
    obj = torch.load(
        io.BytesIO(bytes(data)), map_location=map_location, weights_only=False, pickle_module=_Module(seen)
    )
    return bounded(obj, len(data)), seen


def plain(obj: Any, depth: int = 0) -> Any:
    """``obj`` with stand-ins replaced by their saved attributes (a Namespace's fields), for
    flattening into the canonical view; deep objects are cut at 12 levels."""
    if depth > 12:
        return None
    if isinstance(obj, StandIn):
        return {k: plain(v, depth + 1) for k, v in obj.fields.items()} if obj.fields else repr(obj)
    if isinstance(obj, dict):
        return {str(k): plain(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v, depth + 1) for v in obj]
    return obj


__all__ = ["StandIn", "load_inert", "plain"]
