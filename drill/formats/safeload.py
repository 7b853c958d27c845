"""Deserializing checkpoint files without executing code from them.

``torch.load(weights_only=True)`` always; a layout that legitimately needs more classes (HF's
numpy RNG states, ``TrainingArguments``) names them in an allow-list, per policy. A pickle that
names anything else is refused before it can run, and becomes a finding.
"""

from __future__ import annotations

import importlib
import json
import struct
import warnings
from collections.abc import Iterable
from typing import Any

import torch

from drill.restore.stream import ViewReader

NUMPY_ARRAYS = (
    "numpy._core.multiarray._reconstruct",
    "numpy.core.multiarray._reconstruct",
    "numpy.ndarray",
    "numpy.dtype",
    "numpy.dtypes.UInt32DType",
    "numpy.dtypes.Float64DType",
    "numpy.dtypes.Int64DType",
)
"""What numpy RNG states (HF's ``rng_state*.pth``) are made of: arrays, not code."""


class UnsafePickle(Exception):
    """The file names a global outside the allow-list; nothing in it was executed."""


def resolve_globals(names: Iterable[str]) -> list[Any]:
    """Import the allow-listed objects by dotted name; names that do not import are skipped."""
    objs = []
    for name in names:
        module, _, attr = name.rpartition(".")
        try:
            obj = importlib.import_module(module)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError):
            continue
        objs.append(obj)
    return objs


def load_torch(view: memoryview, allow: Iterable[str] = (), map_location: Any = "cpu") -> Any:
    """``torch.load(weights_only=True)`` from an in-memory file, with an explicit allow-list."""
    try:
        with torch.serialization.safe_globals(resolve_globals(allow)):
            return torch.load(ViewReader(view), map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001
        text = str(exc)
        if "Weights only load failed" in text or "Unsupported global" in text:
            culprit = next((line.strip() for line in text.splitlines() if "Unsupported global" in line), "")
            culprit = culprit.split(" was not an allowed global")[0].replace("WeightsUnpickler error: ", "")
            raise UnsafePickle(culprit or "the pickle names a global outside the allow-list") from None
        raise


_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip


def safetensors_header(view: memoryview) -> dict[str, Any]:
    (n,) = struct.unpack("<Q", view[:8])
    return json.loads(bytes(view[8 : 8 + n]))


def load_safetensors(view: memoryview, device: torch.device) -> dict[str, torch.Tensor]:
    """Tensors from a safetensors file: a JSON header and raw bytes — nothing to unpickle."""
    header = safetensors_header(view)
    base = 8 + struct.unpack("<Q", view[:8])[0]
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        begin, end = meta["data_offsets"]
        dtype = _SAFETENSORS_DTYPES[meta["dtype"]]
        raw = view[base + begin : base + end]
        with warnings.catch_warnings():
            # The mapping is read-only; the tensor is copied off it at once, never written.
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            t = torch.frombuffer(raw, dtype=dtype) if len(raw) else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(meta["shape"]).to(device, copy=True)
    return out
