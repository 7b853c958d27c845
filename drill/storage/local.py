"""Local and shared (POSIX) filesystems.

Files are read through ordinary descriptors, never memory-mapped: a file truncated while it
is mapped kills the reader with SIGBUS (DCP truncates when it re-saves into a directory), and
a drill must turn that into a finding, not die. Opens are non-blocking and type-checked, so a
FIFO planted in a checkpoint is reported instead of hanging the drill.
"""

from __future__ import annotations

import errno
import io
import os
import stat as stat_mod
from collections.abc import Mapping
from operator import itemgetter

from drill.storage.base import CacheState, Entry, EntryKind, NotARegularFile, PathEscapesCheckpoint


def _path(uri: str) -> str:
    return uri[len("file://") :] if uri.startswith("file://") else uri


_KINDS = {stat_mod.S_IFDIR: EntryKind.DIR, stat_mod.S_IFREG: EntryKind.FILE}


def _kind(mode: int) -> EntryKind:
    return _KINDS.get(stat_mod.S_IFMT(mode), EntryKind.OTHER)


_name = itemgetter(0)
"""An entry's name (:class:`Entry` is a tuple)."""


def _link_entry(de: os.DirEntry[str], directory: int, path: str) -> Entry | None:
    """A symlink as listed (``de``, of the directory open as ``directory``, at ``path``): what
    it leads to, dangling, or a loop; None when it was removed while the directory was listed."""
    try:
        target = os.readlink(de.name, dir_fd=directory)
    except FileNotFoundError:
        return None
    try:
        st = de.stat(follow_symlinks=True)
    except FileNotFoundError:
        return Entry(de.name, path, EntryKind.DANGLING, 0, 0.0, target)
    except OSError as exc:  # ELOOP: a link that leads back into itself
        kind = EntryKind.LOOP if exc.errno == errno.ELOOP else EntryKind.DANGLING
        return Entry(de.name, path, kind, 0, 0.0, target)
    return Entry(de.name, path, _kind(st.st_mode), st.st_size, st.st_mtime, target)


class LocalStorage:
    """:class:`~drill.storage.base.Storage` over the local filesystem."""

    positioned_reads = True
    """Spans of one file can be read at once, each at its offset (``os.preadv``)."""

    def list(self, uri: str) -> list[Entry]:
        """The directory's entries, each ``stat``-ed relative to the directory's descriptor
        (``fstatat``: no walk of the whole path for each of 20,000 files)."""
        entries: list[Entry] = []
        append, kinds, other, kind_bits = entries.append, _KINDS.get, EntryKind.OTHER, 0o170000
        new = tuple.__new__  # an Entry without its Python-level constructor: 20,000 of them
        root = _path(uri)
        prefix = os.path.join(root, "")
        directory = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
        try:
            with os.scandir(directory) as it:
                for de in it:
                    if de.is_symlink():
                        link = _link_entry(de, directory, prefix + de.name)
                        if link is not None:
                            append(link)
                        continue
                    try:
                        st = de.stat(follow_symlinks=False)
                    except FileNotFoundError:  # removed while we listed
                        continue
                    append(
                        new(
                            Entry,
                            (
                                de.name,
                                prefix + de.name,
                                kinds(st.st_mode & kind_bits, other),
                                st.st_size,
                                st.st_mtime,
                                None,
                            ),
                        )
                    )
        finally:
            os.close(directory)
        entries.sort(key=_name)
        return entries

    def only_files(self, uri: str, most: int) -> set[str] | None:
        """The names in the directory ``uri`` when it holds nothing but regular files, at most
        ``most`` of them — told by its own entries, with no ``stat`` of each where the
        filesystem records their types; None when it holds anything else (a link, a
        sub-directory, a FIFO or device) or more."""
        names: set[str] = set()
        with os.scandir(_path(uri)) as it:
            for de in it:
                if not de.is_file(follow_symlinks=False) or len(names) >= most:
                    return None
                names.add(de.name)
        return names

    def stat(self, uri: str) -> Entry:
        path = _path(uri)
        try:
            st = os.stat(path)
        except OSError as exc:
            if exc.errno == errno.ENAMETOOLONG:  # nothing can be there: not there, not a storage fault
                raise FileNotFoundError(
                    errno.ENOENT, "a path longer than this system allows", path[:200] + "…"
                ) from None
            raise
        target = os.readlink(path) if os.path.islink(path) else None
        return Entry(
            os.path.basename(path.rstrip("/")) or path, path, _kind(st.st_mode), st.st_size, st.st_mtime, target
        )

    def open(self, uri: str) -> io.RawIOBase:
        return _file_object(self.open_fd(uri))

    def open_below(self, base: str, relative: str) -> tuple[io.RawIOBase, int]:
        if not _one_name(relative):
            fd = self.open_checked(base, relative)  # nested: resolved, then opened
            size = os.fstat(fd).st_size
        else:  # a file directly inside: its directory resolved once (cached), the file never followed
            path = os.path.join(_real_directory(_path(base)), relative)
            try:
                fd = os.open(path, _READ | _NOFOLLOW)
            except OSError as exc:
                if exc.errno not in _A_LINK:
                    raise
                fd = self.open_checked(base, relative)  # a link: followed only if it stays inside
                size = os.fstat(fd).st_size
            else:
                size = _regular_stat(fd, path).st_size
        return _file_object(fd), size

    def open_checked(self, base: str, relative: str) -> int:
        """:meth:`open_fd` of :meth:`child`: the way for a path with a link along it, which is
        followed only where it stays inside ``base``."""
        return self.open_fd(self.child(base, relative))

    def open_fd(self, uri: str) -> int:
        """A raw descriptor of the regular file at ``uri``, for positioned reads (the caller
        closes it): what :meth:`open` wraps, without the file object — hashing thousands of
        small files pays for nothing else."""
        path = _path(uri)
        return _regular(os.open(path, _READ), path)

    def beneath(self, base: str) -> Beneath:
        """An opener of files below ``base`` by relative path (:class:`Beneath`): what
        :meth:`child` and :meth:`open_fd` do together, without a ``stat`` of every component
        of every path."""
        return Beneath(self, base)

    def child(self, base: str, relative: str) -> str:
        parts = [p for p in relative.split("/") if p not in ("", ".")]
        if relative.startswith("/") or ".." in parts or not parts or "\x00" in relative:
            raise PathEscapesCheckpoint(f"path {relative!r} escapes checkpoint {base}")
        root = _real_directory(_path(base))
        target = os.path.join(root, *parts)
        # A symlink inside the checkpoint may point anywhere; resolve it before anything opens
        # it. A path with no link along it is inside the checkpoint by construction.
        if _has_link(root, parts):
            resolved = os.path.realpath(target)
            if os.path.commonpath([root, resolved]) != root:
                raise PathEscapesCheckpoint(f"path {relative!r} in {base} resolves outside it, to {resolved}")
        return target

    def write(self, uri: str, data: bytes, *, replace: bool = False, mode: int = 0o644) -> None:
        """:func:`write_file`: whole or not at all, never through a planted link."""
        write_file(_path(uri), data, replace=replace, mode=mode)

    def normalize(self, uri: str) -> str:
        return os.path.abspath(_path(uri))

    def cached(self, sizes: Mapping[str, int]) -> CacheState:
        from drill.storage.pagecache import resident_bytes

        counts = [resident_bytes(_path(u)) for u in sizes]
        resident = None if any(c is None for c in counts) else sum(c for c in counts if c is not None)
        how = (
            "the page cache (cachestat)"
            if resident is not None
            else "the page cache (this kernel cannot count it: no cachestat)"
        )
        return CacheState(sum(sizes.values()), resident, how)

    def evict(self, sizes: Mapping[str, int]) -> CacheState:
        from drill.storage.pagecache import drop

        drop(_path(u) for u in sizes)
        after = self.cached(sizes)
        return CacheState(
            after.bytes, after.resident, "written back and dropped from the page cache (posix_fadvise DONTNEED)"
        )


def write_file(path: str, data: bytes, *, replace: bool = True, mode: int = 0o644) -> None:
    """Write ``path`` whole or not at all, safely in a directory others can write to (a
    verdict for a launcher, a metrics textfile, a report, a seal): a temporary file of an
    unguessable name created exclusively (``O_EXCL|O_NOFOLLOW``: a link or file planted there
    is never followed or reused) → fsync → rename over ``path`` (which replaces a link planted
    at ``path`` itself, never what it points to) or, without ``replace``, link (which refuses to
    replace: never clobbers a concurrent writer) → fsync the directory. ``mode``: the new file's
    permissions, under the umask."""
    import secrets

    directory = os.path.dirname(path) or "."
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(64):
        tmp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(tmp, flags, mode)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(errno.EEXIST, "no temporary file name was free", directory)
    try:
        with open(fd, "wb", closefd=True) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


_READ = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
"""O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever (a regular
file's reads ignore it)."""
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_A_LINK = frozenset({errno.ELOOP, errno.EMLINK, errno.ENOTDIR})
"""What ``open`` with ``O_NOFOLLOW`` says of a link (Linux: ELOOP, FreeBSD: EMLINK; a link to a
directory opened with ``O_DIRECTORY``: ENOTDIR)."""


def _one_name(relative: str) -> bool:
    """Whether ``relative`` names a file directly inside (no separator, not ``.``/``..``, no NUL)."""
    return "/" not in relative and relative not in ("", ".", "..") and "\x00" not in relative


def _regular_stat(fd: int, path: str, relative: str = "") -> os.stat_result:
    """``fd``'s status, checked to be a regular file's — on the descriptor itself, so a file
    swapped for a FIFO between a listing and the open is caught too; ``fd`` is closed and the
    error raised otherwise. The path named in the error is ``path``, joined with ``relative``
    where given."""
    try:
        st = os.fstat(fd)
        if stat_mod.S_ISREG(st.st_mode):
            return st
        path = os.path.join(path, relative) if relative else path
        if stat_mod.S_ISDIR(st.st_mode):
            raise IsADirectoryError(21, "Is a directory", path)
        raise NotARegularFile(path)
    except BaseException:
        os.close(fd)
        raise


def _file_object(fd: int) -> io.RawIOBase:
    """An unbuffered binary file over ``fd`` (opened non-blocking, read blocking); ``fd`` is
    closed if that fails."""
    try:
        os.set_blocking(fd, True)
        return open(fd, "rb", buffering=0, closefd=True)
    except BaseException:
        os.close(fd)
        raise


def _regular(fd: int, path: str, relative: str = "") -> int:
    """``fd``, checked to be a regular file (:func:`_regular_stat`)."""
    _regular_stat(fd, path, relative)
    return fd


def read_regular(path: str | os.PathLike[str], limit: int, *, tail: bool = False) -> bytes:
    """The bytes of the regular file at ``path`` — a file a user or a run names for drill to
    read (a key, a policy, a verdict, a run's metrics): at most ``limit`` bytes (more is
    :class:`ValueError`; with ``tail``, the last ``limit`` bytes of a file of any size, such as
    a batch job's output), and never a FIFO, socket or device, which could block the open or
    never end (:class:`NotARegularFile`, an ``OSError``). The one way such files are read."""
    path = os.fspath(path)
    fd = os.open(path, _READ)
    size = _regular_stat(fd, path).st_size
    with os.fdopen(fd, "rb") as f:
        if tail:
            f.seek(max(0, size - limit))
            return f.read(limit)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path} holds more than {limit} bytes: not read")
    return data


class Beneath:
    """Opens regular files below one directory by relative path, for positioned reads.

    Each component is opened relative to the one above it with ``O_NOFOLLOW``, so a path with
    no link along it is opened without a ``stat`` of each component — and without the race of
    checking a path and then opening it: a component swapped for a link in between is refused
    by the open itself. A path with a link along it goes the checked way (:meth:`LocalStorage.child`),
    which follows a link that stays inside and refuses one that leads out. The directory's
    descriptor is inherited by forked workers; :meth:`close` releases it.
    """

    def __init__(self, storage: LocalStorage, base: str) -> None:
        self._storage = storage
        self._base = base
        self._root = _path(base)
        self._fd = os.open(_real_directory(self._root), os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))

    def __call__(self, relative: str) -> int:
        if not _one_name(relative):
            return self._nested(relative)
        try:  # a file directly inside: one open, the common case
            fd = os.open(relative, _READ | _NOFOLLOW, dir_fd=self._fd)
        except OSError as exc:
            return self._failed(exc, relative)
        return _regular(fd, self._root, relative)

    def exactly(self, relative: str, size: int) -> bytes | None:
        """The bytes of the file directly inside named ``relative`` when it holds exactly
        ``size`` of them — one open and one read, no ``stat``: how hashing workers read
        thousands of small files, each then checked against its seal by its digest. None for
        anything else (a link, a nested path, another size, a read that fails, something that
        is no regular file): the caller reads it again the checked way (:meth:`__call__`),
        which names the fault."""
        if not _one_name(relative):
            return None
        try:
            fd = os.open(relative, _READ | _NOFOLLOW, dir_fd=self._fd)
        except OSError:
            return None
        try:
            data = os.pread(fd, size + 1, 0)
        except OSError:
            return None
        finally:
            os.close(fd)
        return data if len(data) == size else None

    def _nested(self, relative: str) -> int:
        parts = relative.split("/")
        if not all(map(_one_name, parts)):
            return self._storage.open_checked(self._base, relative)  # refused there, or normalised ("a//b", "./a")
        opened: list[int] = []
        try:
            at = self._fd
            for part in parts[:-1]:
                at = os.open(part, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=at)
                opened.append(at)
            fd = os.open(parts[-1], _READ | _NOFOLLOW, dir_fd=at)
        except OSError as exc:
            return self._failed(exc, relative)
        finally:
            for d in opened:
                os.close(d)
        return _regular(fd, self._root, relative)

    def _failed(self, exc: OSError, relative: str) -> int:
        """A link along the path is followed the checked way; any other error is the path's."""
        if exc.errno in _A_LINK:
            return self._storage.open_checked(self._base, relative)
        exc.filename = os.path.join(self._root, relative)
        raise exc

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Beneath:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_REAL: dict[str, tuple[int, int, str]] = {}
"""Directory → (device, inode, real path): resolved once, checked on every use (a directory
swapped or re-linked since has another inode and is resolved again)."""


def _real_directory(path: str) -> str:
    """``os.path.realpath(path)``, for one ``stat`` when the directory is the one resolved before."""
    try:
        st = os.stat(path)
    except OSError:
        return os.path.realpath(path)
    known = _REAL.get(path)
    if known is not None and known[:2] == (st.st_dev, st.st_ino):
        return known[2]
    real = os.path.realpath(path)
    if len(_REAL) > 4096:
        _REAL.clear()
    _REAL[path] = (st.st_dev, st.st_ino, real)
    return real


def _has_link(root: str, parts: list[str]) -> bool:
    """Whether any component of ``root/parts…`` below ``root`` is a symbolic link (a missing
    one ends the walk: nothing further to resolve)."""
    path = root
    for part in parts:
        path = os.path.join(path, part)
        try:
            if stat_mod.S_ISLNK(os.lstat(path).st_mode):
                return True
        except OSError:
            return False
    return False
