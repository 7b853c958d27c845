"""Where checkpoints live, addressed by ``str`` URIs behind one small protocol.

``pathlib.Path`` would mangle ``s3://bucket/key``; every layer above this one passes strings.
"""

from drill.storage.base import Entry, PathEscapesCheckpoint, Storage, StorageError
from drill.storage.local import LocalStorage


def storage_for(uri: str) -> Storage:
    """The storage that serves ``uri`` (a local path or ``file://`` URI for now)."""
    if "://" in uri and not uri.startswith("file://"):
        scheme = uri.split("://", 1)[0]
        raise StorageError(f"unsupported storage scheme {scheme!r} in {uri!r}")
    return LocalStorage()


__all__ = ["Entry", "LocalStorage", "PathEscapesCheckpoint", "Storage", "StorageError", "storage_for"]
