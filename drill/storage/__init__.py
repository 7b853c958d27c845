"""Where checkpoints live, addressed by ``str`` URIs behind one small protocol.

``pathlib.Path`` would mangle ``s3://bucket/key``; every layer above this one passes strings
and reads only through a :class:`Storage`.
"""

from typing import Any

from drill.storage.base import (
    Entry,
    EntryKind,
    FileChanged,
    Listing,
    NotARegularFile,
    PathEscapesCheckpoint,
    Storage,
    StorageError,
    StorageUnavailable,
    Unaddressable,
)
from drill.storage.local import LocalStorage

SCHEMES = ("file", "s3")
"""URI schemes with a backend here; a plain path is a local file."""


def scheme_of(uri: str) -> str:
    return uri.split("://", 1)[0].lower() if "://" in uri else "file"


def local_storage(uri: str) -> Storage | None:
    """The storage of ``uri`` where it is on this machine's file systems (a plain path, a
    ``file://`` URI) — made without a client, settings or credentials; None for any other."""
    return LocalStorage() if scheme_of(uri) == "file" else None


_defaults: dict[str, Any] = {}


def use_options(options: dict[str, Any] | None) -> None:
    """Make ``options`` the process's default for :func:`storage_for`.

    The replay child calls this with the drill's settings, so a replay entrypoint that reads
    its run directory through :func:`drill.sdk.read_run_file` reaches the same object store.
    """
    _defaults.clear()
    _defaults.update(options or {})


def storage_for(uri: str, options: dict[str, Any] | None = None) -> Storage:
    """The storage that serves ``uri``; raises :class:`Unaddressable` for an unknown scheme or
    object-store settings that cannot be used.

    ``options`` configure an object store (``endpoint_url``, ``region``, ``profile``,
    ``addressing_style``, ``concurrency``, ``part_size``); the environment fills the rest.
    """
    options = _defaults if options is None else options
    scheme = scheme_of(uri)
    if scheme == "file":
        return LocalStorage()
    if scheme == "s3":
        from drill.storage.s3 import S3Config, S3Storage

        try:
            return S3Storage(S3Config.from_env(**(options or {})))
        except (TypeError, ValueError) as exc:
            raise Unaddressable(f"S3 settings: {exc}") from None
    raise Unaddressable(f"unsupported storage scheme {scheme!r} in {uri!r} (supported: local paths, file://, s3://)")


def normalize(uri: str) -> str:
    """The one spelling of a run root or checkpoint that records key on."""
    if scheme_of(uri) == "s3":
        from drill.storage.s3 import split

        bucket, key = split(uri)
        return f"s3://{bucket}/{key}" if key else f"s3://{bucket}"
    return storage_for(uri).normalize(uri)


__all__ = [
    "SCHEMES",
    "use_options",
    "Entry",
    "EntryKind",
    "FileChanged",
    "Listing",
    "LocalStorage",
    "NotARegularFile",
    "PathEscapesCheckpoint",
    "Storage",
    "StorageError",
    "StorageUnavailable",
    "Unaddressable",
    "local_storage",
    "normalize",
    "scheme_of",
    "storage_for",
]
