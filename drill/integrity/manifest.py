"""drill's sealed manifest: what every file of a checkpoint must be, byte for byte.

Written inside the checkpoint as ``drill-manifest.json``::

    {"format": "drill-manifest", "version": 1, "step": 1200, "created_at": "...",
     "chunk_size": 16777216, "frameworks": {"drill": "...", "torch": "...", "python": "..."},
     "files": [{"path": "__0_0.distcp", "size": 530412944, "xxh3_128": "…",
                "chunks": ["…", …]}, …],
     "manifest_xxh3_128": "…"}

``xxh3_128`` of a file is xxh3-128 over its concatenated raw chunk digests; the manifest
digest is xxh3-128 of the canonical JSON (sorted keys, no spaces) of everything else.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata as importlib_metadata
from pathlib import PurePosixPath
from typing import Any

import xxhash

from drill.integrity.hashing import DEFAULT_CHUNK_SIZE, FileHashes, hash_view
from drill.storage import LocalStorage, PathEscapesCheckpoint, Storage

MANIFEST_NAME = "drill-manifest.json"
FORMAT = "drill-manifest"
VERSION = 1


class ManifestInvalid(ValueError):
    """The manifest cannot be trusted; ``code`` is the finding code to report."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class SealConflict(RuntimeError):
    """A different manifest already seals this checkpoint."""


@dataclass(frozen=True, slots=True)
class FileEntry:
    path: str
    size: int
    xxh3_128: str
    chunks: tuple[str, ...]


@dataclass(slots=True, kw_only=True)
class Manifest:
    step: int | None
    chunk_size: int
    files: list[FileEntry]
    created_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat())
    frameworks: dict[str, str] = field(default_factory=dict)
    version: int = VERSION

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def by_path(self) -> dict[str, FileEntry]:
        return {f.path: f for f in self.files}

    def body(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": self.version,
            "step": self.step,
            "created_at": self.created_at,
            "chunk_size": self.chunk_size,
            "frameworks": self.frameworks,
            "files": [{"path": f.path, "size": f.size, "xxh3_128": f.xxh3_128, "chunks": list(f.chunks)} for f in self.files],
        }

    def to_json(self) -> bytes:
        body = self.body()
        body["manifest_xxh3_128"] = self_digest(body)
        return (json.dumps(body, indent=1) + "\n").encode()

    def same_content(self, other: Manifest) -> bool:
        """Whether both seal the same bytes (creation time and versions aside)."""
        return self.by_path() == other.by_path()


def self_digest(body: dict[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return xxhash.xxh3_128_hexdigest(canonical)


def check_relative_path(path: str) -> None:
    """Reject a path that would leave the checkpoint, before anything opens it."""
    p = PurePosixPath(path)
    if not path or p.is_absolute() or ".." in p.parts or "\\" in path or path.startswith("~") or "\x00" in path:
        raise ManifestInvalid("manifest-path-escapes", f"manifest names {path!r}, a path outside the checkpoint")


def parse_manifest(data: bytes) -> Manifest:
    """Parse and validate a manifest: JSON shape, safe paths, and its own digest."""
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ManifestInvalid("manifest-not-json", f"{MANIFEST_NAME} is not JSON ({exc.msg if hasattr(exc, 'msg') else exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ManifestInvalid("manifest-invalid", f"{MANIFEST_NAME} is not a drill manifest")
    if doc.get("version") != VERSION:
        raise ManifestInvalid("manifest-invalid", f"{MANIFEST_NAME} has version {doc.get('version')!r}; this drill reads {VERSION}")
    try:
        files = [
            FileEntry(str(f["path"]), int(f["size"]), str(f["xxh3_128"]), tuple(str(c) for c in f["chunks"]))
            for f in doc["files"]
        ]
        chunk_size = int(doc["chunk_size"])
        claimed = doc.pop("manifest_xxh3_128")
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestInvalid("manifest-invalid", f"{MANIFEST_NAME} is malformed: missing or bad {exc}") from None
    for f in files:
        check_relative_path(f.path)
    if len({f.path for f in files}) != len(files):
        raise ManifestInvalid("manifest-invalid", f"{MANIFEST_NAME} lists a file twice")
    if chunk_size <= 0:
        raise ManifestInvalid("manifest-invalid", f"{MANIFEST_NAME} has chunk size {chunk_size}")
    actual = self_digest(doc)
    if actual != claimed:
        raise ManifestInvalid(
            "manifest-digest-mismatch",
            f"{MANIFEST_NAME} does not match its own digest (recorded {claimed}, computed {actual}): it was edited or damaged",
        )
    return Manifest(
        step=doc.get("step"),
        chunk_size=chunk_size,
        files=files,
        created_at=str(doc.get("created_at")),
        frameworks=dict(doc.get("frameworks") or {}),
        version=doc["version"],
    )


def read_manifest(storage: Storage, checkpoint: str) -> tuple[Manifest | None, bytes | None]:
    """The checkpoint's manifest bytes, parsed; ``(None, None)`` when it is unsealed.

    Raises :class:`ManifestInvalid` when a manifest exists but cannot be trusted.
    """
    uri = storage.child(checkpoint, MANIFEST_NAME)
    try:
        with storage.open(uri) as f:
            data = f.read()
    except FileNotFoundError:
        return None, None
    return parse_manifest(data), data


def list_files(storage: Storage, checkpoint: str) -> dict[str, int]:
    """Every regular file under the checkpoint (relative POSIX path → size), manifest excluded.

    A symlink that leads out of the checkpoint raises :class:`PathEscapesCheckpoint`.
    """
    out: dict[str, int] = {}

    def walk(prefix: str, uri: str) -> None:
        for entry in storage.list(uri):
            rel = f"{prefix}{entry.name}"
            storage.child(checkpoint, rel)  # raises if a symlink leads out
            if entry.is_dir:
                walk(rel + "/", entry.uri)
            elif rel != MANIFEST_NAME and not _is_temp(entry.name):
                out[rel] = entry.size

    walk("", checkpoint)
    return out


def _is_temp(name: str) -> bool:
    return name.startswith(f".{MANIFEST_NAME}.") and name.endswith(".tmp")


def _frameworks() -> dict[str, str]:
    from drill import __version__

    versions = {"drill": __version__, "python": platform.python_version()}
    torch = sys.modules.get("torch")
    if torch is not None:
        versions["torch"] = torch.__version__
    else:
        try:
            versions["torch"] = importlib_metadata.version("torch")
        except importlib_metadata.PackageNotFoundError:
            pass
    return versions


def hash_files(
    storage: Storage, checkpoint: str, paths: list[str], chunk_size: int, workers: int = 4, sha256: frozenset[str] = frozenset()
) -> dict[str, FileHashes | OSError]:
    """Hash each file in parallel (xxhash releases the GIL); an unreadable file maps to its error."""

    def one(rel: str) -> FileHashes | OSError:
        try:
            uri = storage.child(checkpoint, rel)
            view = storage.map(uri)
            if view is None:
                with storage.open(uri) as f:
                    view = memoryview(f.read())
            return hash_view(view, chunk_size, sha256=rel in sha256)
        except OSError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(paths)))) as pool:
        return dict(zip(paths, pool.map(one, paths)))


@dataclass(slots=True)
class SealResult:
    manifest: Manifest
    written: bool
    """False when an identical manifest was already there."""
    path: str


def seal(
    path: str | os.PathLike[str],
    *,
    step: int | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    force: bool = False,
    storage: Storage | None = None,
) -> SealResult:
    """Write ``drill-manifest.json`` into the checkpoint at ``path``: one read of its files.

    An identical existing manifest is left alone; a *different* one raises
    :class:`SealConflict` unless ``force`` (the checkpoint changed after it was sealed —
    which is exactly what a seal exists to catch, so replacing it must be deliberate).
    """
    storage = storage or LocalStorage()
    checkpoint = os.fspath(path)
    if step is None:
        from drill.discover import step_of

        step = step_of(os.path.basename(checkpoint.rstrip("/")))
    sizes = list_files(storage, checkpoint)
    hashed = hash_files(storage, checkpoint, sorted(sizes), chunk_size)
    entries = []
    for rel, h in hashed.items():
        if isinstance(h, OSError):
            raise OSError(h.errno, f"cannot seal {checkpoint}: {rel}: {h.strerror or h}")
        entries.append(FileEntry(rel, h.size, h.digest, tuple(h.chunk_hex)))
    manifest = Manifest(step=step, chunk_size=chunk_size, files=entries, frameworks=_frameworks())
    target = storage.child(checkpoint, MANIFEST_NAME)
    try:
        existing, _ = read_manifest(storage, checkpoint)
    except ManifestInvalid:
        existing = None
        if not force:
            raise SealConflict(f"{target} exists but is not a valid manifest; pass force to replace it") from None
    if existing is not None and existing.same_content(manifest):
        return SealResult(existing, False, target)
    if existing is not None and not force:
        raise SealConflict(f"{target} seals different content: the checkpoint changed after it was sealed")
    _write_atomically(target, manifest.to_json(), replace=force)
    return SealResult(manifest, True, target)


def _write_atomically(target: str, data: bytes, *, replace: bool) -> None:
    """temp file → fsync → rename (or link, which refuses to replace) → fsync the directory."""
    directory = os.path.dirname(target)
    tmp = os.path.join(directory, f".{MANIFEST_NAME}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    try:
        if replace:
            os.replace(tmp, target)
        else:
            try:
                os.link(tmp, target)  # atomic create-if-absent: never clobbers a concurrent seal
            except FileExistsError:
                raise SealConflict(f"{target} appeared while sealing; not replacing it") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = [
    "MANIFEST_NAME",
    "FileEntry",
    "Manifest",
    "ManifestInvalid",
    "PathEscapesCheckpoint",
    "SealConflict",
    "SealResult",
    "list_files",
    "parse_manifest",
    "read_manifest",
    "seal",
]
