"""drill's sealed manifest: what every file of a checkpoint must be, byte for byte.

Written inside the checkpoint as ``drill-manifest.json``::

    {"format": "drill-manifest", "version": 1, "step": 1200, "created_at": "...",
     "chunk_size": 16777216, "frameworks": {"drill": "...", "torch": "...", "python": "..."},
     "files": [{"path": "__0_0.distcp", "size": 530412944, "xxh3_128": "…",
                "chunks": ["…", …]}, …],
     "manifest_xxh3_128": "…"}

``xxh3_128`` of a file is xxh3-128 over its concatenated raw chunk digests; the manifest
digest is xxh3-128 of the canonical JSON (sorted keys, no spaces) of everything else.

drill writes the file as exactly those canonical bytes with the digests appended as its last
members (one line: ``jq . drill-manifest.json`` indents it), so a reader checks the digest
against the bytes as read and parses the bytes it checked — without encoding 20,000 entries
again. A manifest in any other layout (an older drill's indented one, one rewritten by hand)
is parsed, re-encoded canonically and checked the same way as before.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, NamedTuple

import xxhash

from drill import safe_json
from drill.integrity.hashing import DEFAULT_CHUNK_SIZE, FileHashes, chunk_count
from drill.integrity.parallel import hash_files
from drill.integrity.reading import describe_read_error
from drill.storage import EntryKind, PathEscapesCheckpoint, Storage

MANIFEST_NAME = "drill-manifest.json"
FORMAT = "drill-manifest"
VERSION = 1
MAX_MANIFEST_BYTES = 256 << 20
"""A manifest of a million files is ~200 MB; anything larger is not one drill wrote."""


class ManifestInvalid(ValueError):
    """The manifest cannot be trusted; ``code`` is the finding code to report."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class SealConflict(RuntimeError):
    """A different manifest already seals this checkpoint."""


class FileEntry(NamedTuple):
    """One sealed file (a tuple: a seal of 20,000 files is parsed into 20,000 of them)."""

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
    key_id: str | None = None
    """Which key sealed it (a keyed seal), never the key."""
    hmac_sha256: str | None = None
    """HMAC-SHA256 of the canonical manifest under that key (a keyed seal)."""
    signed: bytes = b""
    """The canonical bytes the digests cover, as read (for authenticating a parsed manifest)."""

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
            "files": [
                {"path": f.path, "size": f.size, "xxh3_128": f.xxh3_128, "chunks": list(f.chunks)} for f in self.files
            ],
        }

    def to_json(self, key: bytes | None = None) -> bytes:
        """The manifest file: its body, the body's xxh3-128 digest, and with a key, the key's id
        and an HMAC-SHA256 that only a holder of the key can produce."""
        body = self.body()
        if key is not None:
            body["key_id"] = key_id(key)
        signed = canonical(body)
        tail = f',"manifest_hmac_sha256":"{hmac_sha256(key, signed)}"' if key is not None else ""
        tail += f',"manifest_xxh3_128":"{xxhash.xxh3_128_hexdigest(signed)}"}}\n'
        return signed[:-1] + tail.encode()  # the canonical body, its closing brace after the digests

    def authenticate(self, key: bytes) -> str | None:
        """None when this manifest was sealed with ``key``; else why not, in one sentence."""
        if self.hmac_sha256 is None:
            return "the manifest carries no HMAC: it was sealed without a key, or rewritten by someone without it"
        if self.key_id != key_id(key):
            return f"the manifest was sealed with another key (key id {self.key_id}, this key's is {key_id(key)})"
        import hmac

        if not hmac.compare_digest(hmac_sha256(key, self.signed), self.hmac_sha256):
            return "the manifest's HMAC does not match: it was edited by someone without the key"
        return None

    def same_content(self, other: Manifest) -> bool:
        """Whether both seal the same bytes (creation time and versions aside)."""
        return self.by_path() == other.by_path()


DIGESTS = ("manifest_xxh3_128", "manifest_hmac_sha256")


def canonical(body: dict[str, Any], exclude: tuple[str, ...] = DIGESTS) -> bytes:
    return json.dumps(
        {k: v for k, v in body.items() if k not in exclude}, sort_keys=True, separators=(",", ":")
    ).encode()


def self_digest(body: dict[str, Any]) -> str:
    return xxhash.xxh3_128_hexdigest(canonical(body))


def key_id(key: bytes) -> str:
    """A public name for a key (to tell keys apart in rotation), from which the key cannot be learned."""
    return hmac_sha256(key, b"drill seal key id")[:16]


def hmac_sha256(key: bytes, data: bytes) -> str:
    import hashlib  # OpenSSL's start-up (2 ms) only for keyed seals
    import hmac

    return hmac.new(key, data, hashlib.sha256).hexdigest()


def check_relative_path(path: str) -> None:
    """Reject a path that would leave the checkpoint, before anything opens it."""
    # String tests, not PurePosixPath: a manifest names every file of the checkpoint (tens of thousands).
    if not path or path.startswith(("/", "~")) or ".." in path.split("/") or "\\" in path or "\x00" in path:
        raise ManifestInvalid("manifest-path-escapes", f"manifest names {path!r}, a path outside the checkpoint")


SealedFiles = Callable[[list[FileEntry], int], None]
"""Told a seal's files and chunk size once they are known to be safe to open — before the
seal's own digest is checked, which costs as much again on a seal of thousands of files: a
verifier may start reading them (:mod:`drill.integrity.ahead`)."""


def parse_manifest(data: bytes, sealed_files: SealedFiles | None = None) -> Manifest:
    """Parse and validate a manifest: JSON shape, safe paths, and its own digest."""
    signed, doc = _as_written(data)
    if doc is None:
        try:
            doc = safe_json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise ManifestInvalid(
                "manifest-not-json", f"{MANIFEST_NAME} is not JSON ({exc.msg if hasattr(exc, 'msg') else exc})"
            ) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ManifestInvalid("manifest-invalid", f"{MANIFEST_NAME} is not a drill manifest")
    if doc.get("version") != VERSION:
        raise ManifestInvalid(
            "manifest-invalid", f"{MANIFEST_NAME} has version {doc.get('version')!r}; this drill reads {VERSION}"
        )
    try:
        if not isinstance(doc["files"], list):
            raise TypeError("files is not a list")
        chunk_size = _typed(doc["chunk_size"], int, "chunk_size")
        if chunk_size <= 0:
            raise ManifestInvalid("manifest-invalid", f"{MANIFEST_NAME} has chunk size {chunk_size}")
        files = _entries(doc["files"], chunk_size)
        claimed = doc.pop("manifest_xxh3_128")
        mac = doc.pop("manifest_hmac_sha256", None)
    except ManifestInvalid:  # a ValueError that already says what is wrong
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestInvalid("manifest-invalid", f"{MANIFEST_NAME} is malformed: missing or bad {exc}") from None
    if len({f.path for f in files}) != len(files):
        raise ManifestInvalid("manifest-invalid", f"{MANIFEST_NAME} lists a file twice")
    if signed is not None:  # the parsed JSON of every file is no longer needed: freed before a
        del doc["files"]  # verifier forks its workers, not after (each page it wrote, copied)
    if sealed_files is not None:
        sealed_files(files, chunk_size)
    if signed is None:  # not as drill writes it: the canonical encoding of what was parsed
        signed = canonical(doc)
        actual = xxhash.xxh3_128_hexdigest(signed)
        if actual != claimed:
            raise ManifestInvalid(
                "manifest-digest-mismatch",
                f"{MANIFEST_NAME} does not match its own digest (recorded {claimed}, computed {actual}): it was edited or damaged",
            )
    return Manifest(
        step=doc.get("step") if isinstance(doc.get("step"), int) else None,
        chunk_size=chunk_size,
        files=files,
        created_at=str(doc.get("created_at")),
        frameworks={str(k): str(v) for k, v in (doc.get("frameworks") or {}).items()}
        if isinstance(doc.get("frameworks"), dict)
        else {},
        version=doc["version"],
        key_id=str(doc["key_id"]) if doc.get("key_id") is not None else None,
        hmac_sha256=str(mac) if mac is not None else None,
        signed=signed,
    )


_WRITTEN_TAIL = re.compile(
    rb'(?:,"manifest_hmac_sha256":"([0-9a-f]{64})")?,"manifest_xxh3_128":"([0-9a-f]{32})"\}\n?\Z'
)
"""How :meth:`Manifest.to_json` ends the canonical body: the digests as its last members."""


def _as_written(data: bytes) -> tuple[bytes | None, dict[str, Any] | None]:
    """The bytes the digests cover and what they parse to — the digests put back as members —
    where the manifest is laid out as drill writes it and those bytes match its digest; else
    ``(None, None)``: the caller parses the whole and checks its canonical encoding (which
    also names what is wrong). Only bytes already proven to match the digest are parsed here,
    so what the manifest is taken to say is exactly what its digest (and HMAC) covers."""
    tail = _WRITTEN_TAIL.search(data, max(0, len(data) - 160))
    if tail is None or tail.start() == 0:
        return None, None
    signed = data[: tail.start()] + b"}"
    claimed = tail.group(2).decode()
    if xxhash.xxh3_128_hexdigest(signed) != claimed:
        return None, None
    try:
        doc = safe_json.loads(signed)
    except (ValueError, RecursionError):  # not JSON after all (UnicodeDecodeError is a ValueError)
        return None, None
    if not isinstance(doc, dict) or any(k in doc for k in DIGESTS):
        return None, None  # a digest inside the body too: not what drill writes
    doc["manifest_xxh3_128"] = claimed
    if tail.group(1) is not None:
        doc["manifest_hmac_sha256"] = tail.group(1).decode()
    return signed, doc


def _entries(files: list[Any], chunk_size: int) -> list[FileEntry]:
    """Each file of the manifest, checked (:func:`_file_entry`, :func:`check_relative_path`,
    :func:`_check_chunks`). A file of one chunk under a plain name — every file of a checkpoint
    of thousands of small ones — is checked in one test, without a call per check."""
    out: list[FileEntry] = []
    append, new = out.append, tuple.__new__  # a FileEntry without its Python-level constructor
    for f in files:
        if type(f) is dict:  # ``type(...) is int`` admits no bool
            path, size, chunks = f.get("path"), f.get("size"), f.get("chunks")
            if (
                type(path) is str
                and type(size) is int
                and type(chunks) is list
                and len(chunks) == 1
                and 0 <= size <= chunk_size
                and type(chunks[0]) is str
                and type(f.get("xxh3_128")) is str
                and path.isprintable()  # no NUL
                and "/" not in path
                and "\\" not in path
                and path not in ("", ".", "..")
                and path[0] != "~"
            ):
                append(new(FileEntry, (path, size, f["xxh3_128"], (chunks[0],))))
                continue
        entry = _file_entry(f)
        check_relative_path(entry.path)
        _check_chunks(entry, chunk_size)
        append(entry)
    return out


def _file_entry(f: Any) -> FileEntry:
    """One file of the manifest, its fields of exactly the JSON types drill writes."""
    if type(f) is dict:  # the common case in one test per field (``type(...) is int`` admits no bool)
        path, size, digest, chunks = f.get("path"), f.get("size"), f.get("xxh3_128"), f.get("chunks")
        if (
            type(path) is str
            and type(size) is int
            and type(digest) is str
            and type(chunks) is list
            and all(type(c) is str for c in chunks)
        ):
            return FileEntry(path, size, digest, tuple(chunks))
    return FileEntry(  # raises, naming the field
        _typed(f["path"], str, "path"),
        _typed(f["size"], int, "size"),
        _typed(f["xxh3_128"], str, "xxh3_128"),
        _chunks(f["chunks"]),
    )


def _check_chunks(f: FileEntry, chunk_size: int) -> None:
    """A file's size and its chunk digests agree with the chunk size: the work a verification
    does is bounded by what the manifest lists (a self-consistent manifest that claims 1-byte
    chunks for a large file would otherwise have every byte hashed on its own)."""
    if f.size < 0:
        raise ManifestInvalid("manifest-invalid", f"{MANIFEST_NAME} gives {f.path} a size of {f.size} bytes")
    if len(f.chunks) != chunk_count(f.size, chunk_size):
        raise ManifestInvalid(
            "manifest-invalid",
            f"{MANIFEST_NAME} lists {len(f.chunks)} chunk digests for {f.path} ({f.size} bytes in chunks of "
            f"{chunk_size}): a file of that size has {chunk_count(f.size, chunk_size)}",
        )


def _typed(value: Any, kind: type, what: str) -> Any:
    """A manifest field of exactly the JSON type drill writes (no float sizes, no bools as ints)."""
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"{what} ({type(value).__name__}, expected {kind.__name__})")
    return value


def _chunks(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise TypeError(f"chunks ({type(value).__name__}, expected a list)")
    return tuple(_typed(c, str, "chunk digest") for c in value)


def read_manifest(
    storage: Storage, checkpoint: str, sealed_files: SealedFiles | None = None
) -> tuple[Manifest | None, bytes | None]:
    """The checkpoint's manifest bytes, parsed; ``(None, None)`` when it is unsealed
    (``sealed_files``: see :func:`parse_manifest`).

    Raises :class:`ManifestInvalid` when a manifest exists but cannot be trusted — including
    one that is a directory, a FIFO, or a link out of the checkpoint.
    """
    try:
        uri = storage.child(checkpoint, MANIFEST_NAME)
        with storage.open(uri) as f:
            data = f.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        return None, None
    except PathEscapesCheckpoint as exc:
        raise ManifestInvalid("manifest-path-escapes", f"{MANIFEST_NAME}: {exc}") from None
    except OSError as exc:
        raise ManifestInvalid(
            "manifest-unreadable", f"{MANIFEST_NAME} cannot be read: {describe_read_error(exc)[0]}"
        ) from None
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestInvalid(
            "manifest-invalid", f"{MANIFEST_NAME} is larger than {MAX_MANIFEST_BYTES} bytes: not a manifest drill wrote"
        )
    return parse_manifest(data, sealed_files), data


@dataclass(slots=True)
class Listing:
    """What a checkpoint directory holds, by relative POSIX path."""

    files: dict[str, int] = field(default_factory=dict)
    """Regular files → size (the manifest and drill's temporary files excluded)."""
    odd: dict[str, str] = field(default_factory=dict)
    """Anything else → what it is: a FIFO, socket or device (``other``), a dangling link."""


MAX_DEPTH = 32
"""Directories nested deeper than any checkpoint layout (DCP is flat; accelerate and HF nest
two or three levels) are reported as ``too-deep`` where they begin, not walked."""
MAX_ENTRIES = 1_000_000
"""A checkpoint holding more entries than this is refused as it is listed (a listing that
never ends, an object store prefix of someone else's data)."""


class ListingTooLarge(OSError):
    """The checkpoint holds more entries than :data:`MAX_ENTRIES`."""


def list_files(storage: Storage, checkpoint: str) -> Listing:
    """Every entry under the checkpoint, breadth first and bounded: deep directories and
    links that cannot be resolved are recorded in ``odd`` (a finding on that path), never
    followed. A symlink that leads out of the checkpoint raises
    :class:`PathEscapesCheckpoint`; nothing is opened."""
    out = Listing()
    files = out.files
    # (prefix, uri, depth, whether a link lies on the way down): an entry with no link on its
    # path is inside the checkpoint by construction, and only a path with one is resolved.
    queue: list[tuple[str, str, int, bool]] = [("", checkpoint, 0, False)]
    seen = 0
    while queue:
        prefix, uri, depth, linked = queue.pop(0)
        entries = storage.list(uri)
        seen += len(entries)
        if seen > MAX_ENTRIES:
            raise ListingTooLarge(
                f"{checkpoint} holds more than {MAX_ENTRIES:,} entries: not a checkpoint drill will list"
            )
        for name, entry_uri, kind, size, _, link_target in entries:  # one unpacking: 20,000 shards
            rel = prefix + name
            via_link = linked or link_target is not None
            if via_link and kind is not EntryKind.DANGLING and kind is not EntryKind.LOOP:
                storage.child(checkpoint, rel)  # raises if a symlink leads out
            if kind is EntryKind.FILE:
                # the prefix tested inline: no call for each of 20,000 shards that is no temporary file
                if rel != MANIFEST_NAME and not (name.startswith(_TEMP) and _is_temp(name)):
                    files[rel] = size
            elif kind is not EntryKind.DIR:
                out.odd[rel] = kind.value
            elif depth + 1 >= MAX_DEPTH:
                out.odd[rel] = "too-deep"
            else:
                queue.append((rel + "/", entry_uri, depth + 1, via_link))
    return out


_TEMP = f".{MANIFEST_NAME}."


def _is_temp(name: str) -> bool:
    return name.startswith(_TEMP) and name.endswith(".tmp")


def frameworks() -> dict[str, str]:
    """The versions a manifest names: drill, Python and torch."""
    import platform  # 1.5 ms: only when sealing, never before a verification's hashing

    from drill import __version__

    versions = {"drill": __version__, "python": platform.python_version()}
    torch = sys.modules.get("torch")
    if torch is not None:
        versions["torch"] = torch.__version__
    else:
        from importlib import metadata as importlib_metadata  # 14 ms: only when sealing

        try:
            versions["torch"] = importlib_metadata.version("torch")
        except importlib_metadata.PackageNotFoundError:
            pass
    return versions


def manifest_of(hashes: Mapping[str, FileHashes], *, step: int | None, chunk_size: int) -> Manifest:
    """The manifest of these files' digests (relative path → hashes), as every seal writes it."""
    entries = [FileEntry(rel, h.size, h.digest, tuple(h.chunk_hex)) for rel, h in sorted(hashes.items())]
    return Manifest(step=step, chunk_size=chunk_size, files=entries, frameworks=frameworks())


@dataclass(slots=True)
class SealResult:
    manifest: Manifest
    written: bool
    """False when an identical manifest was already there."""
    path: str


def seal_files(
    path: str | os.PathLike[str],
    *,
    step: int | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    force: bool = False,
    storage: Storage | None = None,
    key: bytes | None = None,
) -> SealResult:
    """Write ``drill-manifest.json`` into the checkpoint at ``path``: one read of its files — of
    whatever the directory is: the writer under :func:`drill.seal` (:func:`drill.verifier.seal`),
    which first makes sure it is one checkpoint (never a run root or an incomplete save).

    With ``key`` (see :func:`drill.integrity.keys.load_key`), the seal is keyed: an HMAC that
    only a holder of the key can produce, so writing the checkpoint is not enough to forge it.
    An identical existing manifest is left alone; a *different* one raises
    :class:`SealConflict` unless ``force`` (the checkpoint changed after it was sealed —
    which is exactly what a seal exists to catch, so replacing it must be deliberate).
    """
    from drill.storage import storage_for

    checkpoint = os.fspath(path)
    storage = storage or storage_for(checkpoint)
    if step is None:
        from drill.checkpoints import step_of

        step = step_of(checkpoint.rstrip("/").rsplit("/", 1)[-1])
    try:
        listing = list_files(storage, checkpoint)
    except PathEscapesCheckpoint as exc:
        raise SealConflict(f"refusing to seal {checkpoint}: {exc}") from None
    if listing.odd:
        rel, kind = sorted(listing.odd.items())[0]
        raise SealConflict(
            f"{rel} in {checkpoint} is not a regular file ({kind}); a checkpoint holding it is not sealed"
        )
    hashes = hash_files(storage, checkpoint, listing.files, chunk_size)
    for rel, h in hashes.items():
        if isinstance(h, OSError):
            raise SealConflict(f"cannot seal {checkpoint}: {rel}: {h.strerror or h}")
    manifest = manifest_of(hashes, step=step, chunk_size=chunk_size)  # type: ignore[arg-type]
    try:
        existing, _ = read_manifest(storage, checkpoint)
    except ManifestInvalid as exc:
        if exc.code in ("manifest-path-escapes", "manifest-unreadable") or not force:
            raise SealConflict(
                f"{checkpoint}/{MANIFEST_NAME} exists but is not a valid manifest ({exc}); not replacing it"
            ) from None
        existing = None
    if existing is not None and existing.same_content(manifest):
        if key is None or existing.authenticate(key) is None:
            return SealResult(existing, False, storage.child(checkpoint, MANIFEST_NAME))
        force = True  # the same bytes, sealed again with the key: the seal only gains a signature
    if existing is not None and not force:
        raise SealConflict(
            f"{checkpoint}/{MANIFEST_NAME} seals different content: the checkpoint changed after it was sealed"
        )
    target = storage.child(checkpoint, MANIFEST_NAME)
    manifest.key_id = key_id(key) if key is not None else None
    try:
        storage.write(target, manifest.to_json(key), replace=force or existing is not None)
    except FileExistsError:
        raise SealConflict(f"{target} appeared while sealing; not replacing it") from None
    return SealResult(manifest, True, target)


__all__ = [
    "MANIFEST_NAME",
    "FileEntry",
    "Listing",
    "Manifest",
    "ManifestInvalid",
    "PathEscapesCheckpoint",
    "SealConflict",
    "SealResult",
    "list_files",
    "manifest_of",
    "parse_manifest",
    "read_manifest",
    "seal_files",
]
