"""Deserializing checkpoint files without executing code from them.

``torch.load(weights_only=True)`` always; a layout that legitimately needs more classes (HF's
numpy RNG states, ``TrainingArguments``) names them in an allow-list, per policy. A pickle that
names anything else is refused before it can run, and becomes a finding.
"""

from __future__ import annotations

import functools
import importlib
import json
import re
import struct
import warnings
from collections.abc import Iterable
from typing import IO, Any, cast

import torch

from drill import safe_json
from drill.safe_pickle import PickleBomb, bounded
from drill.views import ViewReader

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

INERT_VALUES = (
    # time: a save's wall-clock fields (Composer's timestamp)
    "datetime.datetime", "datetime.date", "datetime.time", "datetime.timedelta", "datetime.timezone",
    # versions, ids, numbers, paths, containers: plain values a trainer records beside its state
    "torch.torch_version.TorchVersion", "uuid.UUID", "decimal.Decimal", "fractions.Fraction",
    "pathlib.Path", "pathlib.PosixPath", "pathlib.PurePosixPath", "pathlib.WindowsPath", "pathlib.PureWindowsPath",
    "collections.OrderedDict", "collections.Counter",
    # numpy arrays, scalars and dtypes (per-rank numpy RNG states): rebuilt from their bytes
    *NUMPY_ARRAYS, "numpy._core.multiarray.scalar", "numpy.core.multiarray.scalar",
    "numpy.dtypes.Float32DType", "numpy.dtypes.Float16DType", "numpy.dtypes.Int32DType", "numpy.dtypes.Int8DType",
    "numpy.dtypes.Int16DType", "numpy.dtypes.UInt8DType", "numpy.dtypes.UInt16DType", "numpy.dtypes.UInt64DType",
    "numpy.dtypes.BoolDType",
)  # fmt: skip
"""The classes every writer pickles as plain values, admitted by every ``torch.load`` drill
makes (beside ``--allow-class``): each builds a value from its arguments — a time, a version
string, a path, an array from its bytes — and runs no code of the file's choosing (tested:
``tests/test_security.py``). Anything else stays refused, named."""


class UnsafePickle(Exception):
    """The file names a global outside the allow-list, or is code; nothing in it was executed."""

    def __init__(self, named: str, *, code: bool = False) -> None:
        super().__init__(named)
        self.code = code
        """Whether the global is code itself (:func:`drill.safe_pickle.names_code`), not merely unlisted."""

    @classmethod
    def of(cls, dotted: str) -> UnsafePickle:
        """The refusal of a global torch's allow-list named, saying whether it is code."""
        from drill.safe_pickle import names_code

        module, _, name = dotted.rpartition(".")
        return cls(dotted, code=bool(module) and names_code(module, name))

    @property
    def reason(self) -> str:
        """The refusal, in one sentence, for the finding."""
        if str(self) == CODE_ARCHIVE:
            return f"refused to load: it is {CODE_ARCHIVE}; nothing in it was executed"
        why = "code a trainer's own unpickler would run" if self.code else "outside the allow-list"
        return f"refused to unpickle: it names {self}, {why}; nothing in it was executed"


CODE_ARCHIVE = "a TorchScript archive (it carries code: code/, constants.pkl)"
"""What :func:`check_archive` calls a file that torch would hand to ``torch.jit.load``."""


class UnboundedArchive(ValueError):
    """A zip record is compressed: torch.save never compresses, and a compressed record can
    expand without bound (a zip bomb). Refused before anything is inflated."""

    code = "zip-record-compressed"


def check_archive(view: memoryview) -> int:
    """What a ``torch.save`` zip claims to hold, in bytes — checked before torch sees it.

    Raises :class:`UnsafePickle` for a TorchScript archive (``torch.load`` dispatches it to
    ``torch.jit.load``, which compiles and runs the code inside — with ``weights_only=False``,
    as the inert side-file reader runs, that is code from the checkpoint) and
    :class:`UnboundedArchive` for a compressed record. A file that is no zip claims nothing
    (0): the loaders refuse or judge it themselves.
    """
    import zipfile

    if bytes(view[:4]) != b"PK\x03\x04":
        return 0
    try:
        with zipfile.ZipFile(ViewReader(view)) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return 0  # not readable as a zip: torch.load will fail on it, running nothing
    for info in infos:
        inner = info.filename.split("/", 1)[1] if "/" in info.filename else info.filename
        if inner == "constants.pkl" or inner.startswith("code/"):
            raise UnsafePickle(CODE_ARCHIVE)
    compressed = [i.filename for i in infos if i.compress_type != zipfile.ZIP_STORED]
    if compressed:
        raise UnboundedArchive(
            f"record {compressed[0]} is compressed ({len(compressed)} of {len(infos)}): torch.save never compresses, and an inflated record is unbounded; not loaded"
        )
    return sum(i.file_size for i in infos)


_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")
_REASON = re.compile(r"WeightsUnpickler error:\s*(.+?)\s*(?:\n\n|Check the documentation|$)", re.S)


def load_failure(exc: BaseException) -> tuple[str, str]:
    """(finding code, reason) for a value ``torch.load(weights_only=True)`` refused.

    torch words every refusal "Weights only load failed": only a pickle that names a global
    outside the allow-list is ``unsafe-pickle`` (and the global is named); bytes that do not
    unpickle at all — corruption, truncation — are ``entry-not-loaded``.
    """
    if isinstance(exc, PickleBomb):
        return exc.code, str(exc)
    text = str(exc)
    named = _GLOBAL.search(text)
    if named:
        return "unsafe-pickle", UnsafePickle.of(named.group(1)).reason
    detail = _REASON.search(text)
    why = " ".join(detail.group(1).split()) if detail else (text.strip().splitlines() or [type(exc).__name__])[0]
    return "entry-not-loaded", f"the bytes do not unpickle ({why}): damaged or truncated"


def inert_values() -> list[Any]:
    """:data:`INERT_VALUES`, resolved, for ``torch.serialization.safe_globals``: what every load admits."""
    return resolve_globals(INERT_VALUES)


def resolve_globals(names: Iterable[str]) -> list[Any]:
    """Import the allow-listed objects by dotted name; names that do not import are skipped.
    Resolved once per list (a drill resolves its list before the restore's clock starts: an
    import is not restore time)."""
    return list(_resolved(tuple(names)))


@functools.lru_cache(maxsize=64)
def _resolved(names: tuple[str, ...]) -> tuple[Any, ...]:
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
    return tuple(objs)


def load_torch(view: memoryview, allow: Iterable[str] = (), map_location: Any = "cpu") -> Any:
    """``torch.load(weights_only=True)`` from an in-memory file, with an explicit allow-list.

    Raises :class:`UnsafePickle` (naming the global) for a pickle that names code outside the
    allow-list; any other failure propagates (see :func:`load_failure`).
    """
    check_archive(view)
    try:
        with torch.serialization.safe_globals(resolve_globals((*INERT_VALUES, *allow))):
            loaded = torch.load(cast("IO[bytes]", ViewReader(view)), map_location=map_location, weights_only=True)
    except Exception as exc:
        named = _GLOBAL.search(str(exc))
        if named:
            raise UnsafePickle.of(named.group(1)) from None
        raise
    return bounded(loaded, len(view))


_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip


def load_safetensors(view: memoryview, device: torch.device) -> dict[str, torch.Tensor]:
    """Tensors from a safetensors file: a JSON header and raw bytes — nothing to unpickle.

    Raises ``ValueError`` naming the problem when the header does not describe the bytes
    (a shape that needs more bytes than its span, a span past the end, an unknown dtype).
    """
    from drill.integrity.structure import layout_problems, safetensors_spans

    if len(view) < 8:
        raise ValueError(f"{len(view)} bytes: too short for a safetensors header")
    (n,) = struct.unpack("<Q", view[:8])
    if 8 + n > len(view):
        raise ValueError(f"header of {n} bytes runs past the file ({len(view)} bytes)")
    try:
        header = safe_json.loads(bytes(view[8 : 8 + n]))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise ValueError("the safetensors header is not JSON") from None
    base = 8 + n
    out = {}
    spans = safetensors_spans(header)
    problems = layout_problems(spans, len(view) - base)
    if problems:  # what safetensors' own loader refuses (overlapping, gapped or short spans), drill refuses
        raise ValueError(problems[0][1])
    for begin, end, name in spans:
        meta = header[name]
        dtype = _SAFETENSORS_DTYPES.get(meta.get("dtype"))  # its shape and span agree (safetensors_spans)
        shape = meta["shape"]
        if dtype is None:
            raise ValueError(f"tensor {name!r}: unsupported dtype {meta.get('dtype')!r}")
        raw = view[base + begin : base + end]
        with warnings.catch_warnings():
            # The buffer is read-only; the tensor is copied off it at once, never written.
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            t = torch.frombuffer(raw, dtype=dtype) if len(raw) else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(shape).to(device, copy=True)
    return out
