"""What a restore did, as evidence for the checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from drill.integrity.hashing import FileHashes


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor of a checkpoint, from the format's own index where it has one."""

    key: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    rank: int | None = None


@dataclass(slots=True)
class FileRead:
    relative_path: str
    size: int | None
    """Size on storage when the restore began; None when it could not be stat'ed."""
    bytes_read: int = 0
    error: str | None = None
    error_kind: str | None = None
    """``missing``, ``unreadable``, ``escapes``, ``not-regular`` or ``changed`` (see
    :func:`drill.integrity.reading.describe_read_error`)."""
    retries: int = 0
    """Transient read errors survived by reading again."""
    hashes: FileHashes | None = None
    """Chunk digests of the bytes read, computed in the same pass that restores them."""
    items: int = 0
    """How many state entries the checkpoint's metadata places in this file."""


@dataclass(slots=True)
class ItemFailure:
    key: str
    relative_path: str | None
    reason: str
    code: str = "entry-not-loaded"
    """``unsafe-pickle`` when the entry named code outside the allow-list (never run)."""


@dataclass(slots=True)
class RestoreResult:
    uri: str
    format: str
    device: str
    state: dict[str, Any] = field(default_factory=dict)
    """Flat ``part.key.path`` → tensor on ``device`` or a plain Python value."""
    files: list[FileRead] = field(default_factory=list)
    failures: list[ItemFailure] = field(default_factory=list)
    metadata_error: str | None = None
    """Why nothing of the state could be loaded (an unreadable or unsafe index), if so."""
    metadata_code: str | None = None
    """The finding code for ``metadata_error`` when the adapter knows it (``metadata-implausible``)."""
    index: Any = None
    """The format's own index of where each entry lives (DCP: ``Metadata.storage_data``)."""
    index_file: str | None = None
    """The file that holds that index (DCP's ``.metadata``), named when it cannot be read."""
    inventory: list[TensorInfo] = field(default_factory=list)
    """Every tensor: key, shape, dtype, bytes, rank — read from metadata where possible."""
    layout: Any = None
    """:class:`drill.formats.canonical.Layout`: what the format knows about itself."""
    structure: Any = None
    """(findings, evidence) of the format's structural proof, where the adapter made one."""
    tensors_loaded: int = 0
    tensor_bytes: int = 0
    values_loaded: int = 0
    chunks: list[tuple[str, tuple[int, ...], Any]] = field(default_factory=list)
    """Chunks of tensors this rank restored only part of (a distributed restore): key, offsets, tensor."""
    finite: dict[str, list[int]] | None = None
    """Per tensor key, what a distributed restore's ranks found scanning their shares:
    [elements scanned, NaN, Inf, 1 if every element was zero]. None: scan ``state`` here."""
    read_seconds: float = 0.0
    """Time the restore waited on storage (bytes not yet read)."""
    load_seconds: float = 0.0
    """Time spent deserializing and copying onto the device."""

    @property
    def bytes_read(self) -> int:
        return sum(f.bytes_read for f in self.files)

    @property
    def bytes_on_storage(self) -> int:
        return sum(f.size or 0 for f in self.files)

    @property
    def failed_keys(self) -> set[str]:
        return {f.key for f in self.failures}
