"""Hashing a sealed checkpoint's files while ``drill verify`` still asks what the checkpoint is.

A verification lists the directory and asks every format what it holds, reads the seal and
checks the seal's own digest, and only then hashes the files. On a checkpoint of thousands of
small files those steps in this one process cost as much as the hashing on every core. Where
the checkpoint is a local directory of regular files only and drill may fork its hashing
workers, the seal is read first and its files start hashing as soon as the seal is known to
name only paths inside the checkpoint: the workers hash while this process lists, recognizes
and checks. (A file of several chunks is cut into spans by its size on storage, never by the
size the seal, not yet verified, claims.) The plan then takes their digests for each file that is still what the seal says
(listed at the size sealed, and proven that size by the read itself); anything else is hashed
afterwards, as without a head start. Nothing is opened that the directory does not list as a
regular file, nothing where a verification would refuse to open anything (a framework's
manifest, which could name a path out of the checkpoint; more entries than a listing takes),
and a seal that fails its own digest leaves the plan without a seal, as before.

A head start may also be begun before anything asks for a verification (:func:`begin`):
``drill verify``'s console script begins one before it loads its command line
(:mod:`drill.cli.early`), and the verification takes it (:func:`head_start`'s ``begun``) only
for the same directory, verified in full — any other is stopped, its digests unused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from drill.integrity.foreign import is_foreign_manifest
from drill.integrity.manifest import MAX_ENTRIES, FileEntry, Manifest, ManifestInvalid, read_manifest
from drill.integrity.parallel import Hashing, free_cores
from drill.integrity.sampling import SampleSpec
from drill.storage import Entry, Storage

if TYPE_CHECKING:
    from drill.integrity.hashing import AsSealed, FileHashes
    from drill.storage.apart import Apart


@dataclass(slots=True)
class HeadStart:
    """The seal of ``checkpoint`` as read before the plan (``manifest`` or ``error``, both None
    when unsealed), and its files hashing since."""

    checkpoint: str = ""
    manifest: Manifest | None = None
    error: ManifestInvalid | None = None
    hashing: Hashing | None = None
    sizes: dict[str, int] = field(default_factory=dict)
    """The files hashed ahead → the size each was hashed at (its sealed size)."""
    listed_apart: Apart | None = None
    """The checkpoint directory being listed in a forked child while the seal parses (a
    directory of thousands of files, :mod:`drill.storage.apart`): the verification's listing."""

    def take(self, listed: Mapping[str, int], sha256: frozenset[str]) -> dict[str, FileHashes | OSError | AsSealed]:
        """The digests of the files among ``listed`` (path → size listed) hashed ahead at the
        size listed — :data:`~drill.integrity.hashing.AS_SEALED` for a file of one chunk that
        matched the seal where it was hashed; files that also need a SHA-256 are not among them."""
        if self.hashing is None:
            return {}
        if listed == self.sizes and not sha256:  # every file, as sealed and listed: all of them
            return dict(self.hashing.results())
        wanted = [p for p, size in listed.items() if self.sizes.get(p) == size and p not in sha256]
        if not wanted:
            return {}
        got = self.hashing.results()
        return {p: got[p] for p in wanted}

    def listing(self) -> list[Entry] | None:
        """The checkpoint directory's entries as listed apart (waiting for them once); None
        where it was not, or the child could not say: then the verification lists it."""
        return self.listed_apart.entries() if self.listed_apart is not None else None

    def stop(self) -> None:
        if self.hashing is not None:
            self.hashing.stop()
        if self.listed_apart is not None:
            self.listed_apart.stop()


@contextmanager
def head_start(
    storage: Storage, checkpoint: str, sample: SampleSpec, begun: HeadStart | None = None
) -> Iterator[HeadStart | None]:
    """The seal of ``checkpoint`` read and its files hashing, where that can start now: a full
    verification (a sample depends on the ledger) of a local directory holding regular files
    only, in a process that may fork, on as many workers as cores are free (one, where another
    process holds the other: the worker then hashes while the command waits on its own reads
    and imports, instead of after them). None otherwise. ``begun`` (:func:`begin`) is taken instead of a
    new start where it is of this checkpoint and the verification is full; otherwise it is
    stopped. The workers are stopped on leaving."""
    ahead = None
    if begun is not None:
        if sample.is_full and begun.checkpoint == checkpoint:
            ahead = begun
        else:
            begun.stop()
    if ahead is None and sample.is_full:
        ahead = _start(storage, checkpoint)
    try:
        yield ahead
    finally:
        if ahead is not None:
            ahead.stop()


def begin(uri: str) -> HeadStart | None:
    """A head start on the checkpoint directory ``uri`` begun before its verification is
    asked for, to be taken by :func:`head_start` (``begun``) or stopped. Only on this
    machine's file systems (no object-store client is made for it), and only where
    :func:`head_start` would begin one. Nothing it meets is raised: what fails this early
    (an unreadable seal, a directory that is not there) the verification meets again, and
    says."""
    from drill.memory import collector_paused
    from drill.storage import local_storage

    storage = local_storage(uri)
    if storage is None:
        return None
    try:
        with collector_paused():  # a seal of thousands of files' digests
            return _start(storage, storage.normalize(uri))
    except Exception:  # noqa: BLE001 - the verification itself finds it, and says what it is
        return None


def _start(storage: Storage, checkpoint: str) -> HeadStart | None:
    from drill.proc import may_fork
    from drill.storage.apart import list_apart

    only_files = getattr(storage, "only_files", None)
    if only_files is None or not getattr(storage, "positioned_reads", False) or not may_fork():
        return None
    workers = free_cores(8)
    ahead = HeadStart(checkpoint)

    def openable() -> set[str] | None:
        return _openable(only_files, checkpoint)

    def openable_sent() -> list[str] | None:  # sent as a list: marshal sorts a set's members (3.11+)
        names = openable()
        return None if names is None else list(names)

    # A directory of thousands of files is listed in a child, which answers first what may be
    # opened: the question costs this process nothing while it parses the seal.
    ahead.listed_apart = list_apart(storage, checkpoint, MAX_ENTRIES, first=openable_sent)
    names = None
    if ahead.listed_apart is None:
        names = openable()
        if names is None:
            return None

    def hash_sealed(files: list[FileEntry], chunk_size: int) -> None:
        nonlocal names
        if names is None:
            sent, told = ahead.listed_apart.first() if ahead.listed_apart is not None else (False, None)
            names = (None if told is None else set(told)) if sent else openable()
            if names is None:
                raise _NotAhead
        ahead.sizes = {
            f.path: f.size
            for f in files
            if f.path in names and (f.size <= chunk_size or _size_now(storage, checkpoint, f.path) == f.size)
        }
        # Files of one chunk are compared with the seal where they are hashed: a file that
        # matches comes back AS_SEALED, not as a digest for this process to compare.
        sealed = {f.path: f.chunks[0] for f in files if len(f.chunks) == 1 and f.path in ahead.sizes}
        ahead.hashing = Hashing(storage, checkpoint, ahead.sizes, chunk_size, workers, sealed=sealed)

    try:
        ahead.manifest, _ = read_manifest(storage, checkpoint, hash_sealed)
    except _NotAhead:
        ahead.stop()
        return None
    except ManifestInvalid as exc:  # its digest, after the hashing began: the plan has no seal
        if ahead.hashing is not None:
            ahead.hashing.stop()  # the listing apart goes on: the verification's, seal or none
        ahead.hashing, ahead.error = None, exc
    except BaseException:
        ahead.stop()
        raise
    return ahead


class _NotAhead(Exception):
    """The directory holds something a head start may not open around (:func:`_openable`)."""


def _openable(only_files: Callable[[str, int], set[str] | None], checkpoint: str) -> set[str] | None:
    """The names of the checkpoint's files where a head start may open them: regular files
    only (told by the directory's own entries, no ``stat`` of each), at most
    :data:`MAX_ENTRIES`, and no framework's manifest among them (which could name a path out).
    None otherwise — and where it cannot be listed: the verification says why."""
    try:
        names = only_files(checkpoint, MAX_ENTRIES)
    except OSError:  # not a directory, not there, not readable: the verification says which
        return None
    if names is None or any(map(is_foreign_manifest, names)):
        return None
    return names


def _size_now(storage: Storage, checkpoint: str, path: str) -> int | None:
    """The size of a file of several chunks as it is now, before it is cut into spans: never
    the size the seal (not yet verified) claims — a seal of megabytes could claim chunks of
    petabytes, and so millions of spans. A file of one chunk needs no ``stat``: it is one read,
    bounded by the file itself. None when it cannot be said (the listing will)."""
    try:
        return storage.stat(storage.child(checkpoint, path)).size
    except OSError:
        return None


__all__ = ["HeadStart", "begin", "head_start"]
