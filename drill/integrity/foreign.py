"""Manifests that frameworks write themselves, verified alongside drill's own.

- Megatron dist_checkpointing's ``integrity.json``: ``{"algorithm": "sha256", "files":
  {name: sha256}}`` — content hashes, checked in the same read as everything else.
- safetensors shard indexes (``*.safetensors.index.json``): ``weight_map`` names every
  shard — presence only, no content hashes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from drill import safe_json
from drill.integrity.manifest import ManifestInvalid, check_relative_path
from drill.integrity.reading import describe_read_error
from drill.storage import Storage

MEGATRON_INTEGRITY = "integrity.json"


@dataclass(slots=True)
class ForeignManifest:
    name: str
    """File name inside the checkpoint, e.g. ``integrity.json``."""
    kind: str
    """``megatron-sha256`` (content hashes) or ``safetensors-index`` (presence only)."""
    sha256: dict[str, str] = field(default_factory=dict)
    """Relative path → expected SHA-256 (for content manifests)."""
    listed: set[str] = field(default_factory=set)
    """Every path the manifest names."""
    error: ManifestInvalid | None = None

    @property
    def proves(self) -> str:
        return "content (SHA-256 per file)" if self.kind == "megatron-sha256" else "presence of every shard it names"


MAX_BYTES = 64 << 20


def _load_json(storage: Storage, checkpoint: str, name: str) -> object:
    with storage.open(storage.child(checkpoint, name)) as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ManifestInvalid("foreign-manifest-invalid", f"{name} is larger than {MAX_BYTES} bytes")
    return safe_json.loads(data)


def _megatron(doc: object) -> ForeignManifest:
    fm = ForeignManifest(MEGATRON_INTEGRITY, "megatron-sha256")
    if not isinstance(doc, dict) or not isinstance(doc.get("files"), dict):
        raise ManifestInvalid("foreign-manifest-invalid", f"{MEGATRON_INTEGRITY} has no 'files' map")
    if doc.get("algorithm", "sha256") != "sha256":
        raise ManifestInvalid(
            "foreign-manifest-invalid", f"{MEGATRON_INTEGRITY} uses {doc.get('algorithm')!r}, not sha256"
        )
    for path, digest in doc["files"].items():
        check_relative_path(str(path))
        fm.sha256[str(path)] = str(digest).lower()
        fm.listed.add(str(path))
    return fm


def _safetensors_index(name: str, doc: object) -> ForeignManifest:
    fm = ForeignManifest(name, "safetensors-index")
    if not isinstance(doc, dict) or not isinstance(doc.get("weight_map"), dict):
        raise ManifestInvalid("foreign-manifest-invalid", f"{name} has no 'weight_map'")
    beside = name.rpartition("/")[0]  # shards lie beside their index, wherever the index lies
    for shard in set(doc["weight_map"].values()):
        check_relative_path(str(shard))
        fm.listed.add(f"{beside}/{shard}" if beside else str(shard))
    return fm


def is_foreign_manifest(name: str) -> bool:
    """Whether the file ``name`` (relative to the checkpoint) is a framework's manifest."""
    return name == MEGATRON_INTEGRITY or name.endswith(".safetensors.index.json")


def find_foreign_manifests(storage: Storage, checkpoint: str, names: set[str]) -> list[ForeignManifest]:
    """Every framework manifest among ``names`` (the checkpoint's files), parsed."""
    found = []
    for name in sorted(filter(is_foreign_manifest, names)):  # the few, then sorted: not 20,000 shards
        try:
            doc = _load_json(storage, checkpoint, name)
            found.append(_megatron(doc) if name == MEGATRON_INTEGRITY else _safetensors_index(name, doc))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            found.append(
                ForeignManifest(
                    name, "unknown", error=ManifestInvalid("foreign-manifest-invalid", f"{name} is not JSON")
                )
            )
        except ManifestInvalid as exc:
            found.append(ForeignManifest(name, "unknown", error=exc))
        except OSError as exc:
            why = describe_read_error(exc)[0]
            found.append(
                ForeignManifest(
                    name,
                    "unknown",
                    error=ManifestInvalid("foreign-manifest-invalid", f"{name} cannot be read: {why}"),
                )
            )
    return found
