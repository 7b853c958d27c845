"""Where checkpoints live, addressed by ``str`` URIs behind one small protocol.

``pathlib.Path`` would mangle ``s3://bucket/key``; every layer above this one passes strings
and reads only through a :class:`Storage`.
"""

from drill.storage.base import Entry, EntryKind, NotARegularFile, PathEscapesCheckpoint, Storage, StorageError
from drill.storage.local import LocalStorage

SCHEMES = ("file",)
"""URI schemes with a backend here; a plain path is a local file."""


def scheme_of(uri: str) -> str:
    return uri.split("://", 1)[0].lower() if "://" in uri else "file"


def storage_for(uri: str) -> Storage:
    """The storage that serves ``uri``; raises :class:`StorageError` for an unknown scheme."""
    scheme = scheme_of(uri)
    if scheme == "file":
        return LocalStorage()
    raise StorageError(f"unsupported storage scheme {scheme!r} in {uri!r} (supported: local paths, file://)")


def normalize(uri: str) -> str:
    """The one spelling of a run root or checkpoint that records key on."""
    return storage_for(uri).normalize(uri)


__all__ = [
    "SCHEMES",
    "Entry",
    "EntryKind",
    "LocalStorage",
    "NotARegularFile",
    "PathEscapesCheckpoint",
    "Storage",
    "StorageError",
    "normalize",
    "scheme_of",
    "storage_for",
]
