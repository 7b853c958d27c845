"""Opening files below a checkpoint by relative path (``LocalStorage.beneath``): what
``child`` + ``open_fd`` would open, refusing what they refuse — without a ``stat`` of every
component, and without the race between checking a path and opening it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from drill.storage import LocalStorage, NotARegularFile, PathEscapesCheckpoint


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    root = tmp_path / "ckpt"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "a.distcp").write_bytes(b"top")
    (root / "sub" / "deeper" / "b.bin").write_bytes(b"nested")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_bytes(b"not the checkpoint's")
    return root


def _read(fd: int) -> bytes:
    try:
        return os.pread(fd, 100, 0)
    finally:
        os.close(fd)


def test_files_inside_and_nested_open_as_child_and_open_fd_would(ckpt: Path) -> None:
    storage = LocalStorage()
    with storage.beneath(str(ckpt)) as opener:
        for rel in ("a.distcp", "sub/deeper/b.bin"):
            assert _read(opener(rel)) == _read(storage.open_fd(storage.child(str(ckpt), rel)))


@pytest.mark.parametrize("rel", ["../outside/secret", "/etc/hostname", "sub/../../outside/secret", "a\x00b", ""])
def test_a_path_out_of_the_checkpoint_is_refused(ckpt: Path, rel: str) -> None:
    with LocalStorage().beneath(str(ckpt)) as opener, pytest.raises(PathEscapesCheckpoint):
        opener(rel)


@pytest.mark.parametrize("where", ["file", "directory on the way"])
def test_a_link_out_is_refused_and_a_link_inside_followed(ckpt: Path, where: str) -> None:
    outside = ckpt.parent / "outside"
    if where == "file":
        (ckpt / "out").symlink_to(outside / "secret")
        (ckpt / "in").symlink_to("a.distcp")
        out, inside = "out", "in"
    else:
        (ckpt / "out").symlink_to(outside)
        (ckpt / "in").symlink_to("sub")
        out, inside = "out/secret", "in/deeper/b.bin"
    with LocalStorage().beneath(str(ckpt)) as opener:
        with pytest.raises(PathEscapesCheckpoint):
            opener(out)
        assert _read(opener(inside)) in (b"top", b"nested")


def test_a_directory_swapped_for_a_link_after_the_listing_is_refused_by_the_open(ckpt: Path) -> None:
    """The race the check-then-open way has: the path was clean when listed; a component is
    replaced by a link out before the file is opened."""
    outside = ckpt.parent / "outside"
    (outside / "deeper").mkdir()
    (outside / "deeper" / "b.bin").write_bytes(b"planted")
    with LocalStorage().beneath(str(ckpt)) as opener:
        os.rename(ckpt / "sub", ckpt.parent / "moved")
        (ckpt / "sub").symlink_to(outside)
        with pytest.raises(PathEscapesCheckpoint):
            opener("sub/deeper/b.bin")


def test_what_is_not_a_regular_file_is_never_opened_for_reading(ckpt: Path) -> None:
    os.mkfifo(ckpt / "fifo")
    with LocalStorage().beneath(str(ckpt)) as opener:
        with pytest.raises(NotARegularFile):
            opener("fifo")  # O_NONBLOCK: no writer, no hang
        with pytest.raises(IsADirectoryError):
            opener("sub")
        with pytest.raises(FileNotFoundError) as missing:
            opener("sub/gone.bin")
    assert missing.value.filename == str(ckpt / "sub" / "gone.bin")


def test_exactly_reads_a_file_inside_of_exactly_that_size_and_nothing_else(ckpt: Path) -> None:
    """The hashing workers' one-read path: the bytes of a regular file directly inside when it
    holds exactly the size asked; None — for the checked way to name — for everything else."""
    outside = ckpt.parent / "outside" / "secret"
    (ckpt / "in").symlink_to("a.distcp")
    (ckpt / "out").symlink_to(outside)
    os.mkfifo(ckpt / "fifo")
    with LocalStorage().beneath(str(ckpt)) as opener:
        assert opener.exactly("a.distcp", 3) == b"top"
        assert opener.exactly("a.distcp", 2) is None  # longer than asked
        assert opener.exactly("a.distcp", 4) is None  # shorter
        for rel in ("in", "out", "fifo", "sub", "sub/deeper/b.bin", "gone", "..", ".", "a\x00b", ""):
            assert opener.exactly(rel, 3) is None, rel


def test_forked_workers_inherit_the_opener(ckpt: Path) -> None:
    opener = LocalStorage().beneath(str(ckpt))
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports by its exit status
            os._exit(0 if _read(opener("a.distcp")) == b"top" else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        opener.close()


def test_open_below_opens_sizes_and_refuses_as_child_and_open_do(ckpt: Path) -> None:
    """``open_below`` (a reader's one step per file: open and size): a file directly inside or
    nested, a link inside followed, a link out, a path out and a FIFO refused."""
    storage = LocalStorage()
    (ckpt / "in").symlink_to("a.distcp")
    (ckpt / "out").symlink_to(ckpt.parent / "outside" / "secret")
    os.mkfifo(ckpt / "fifo")
    for rel, want in (("a.distcp", b"top"), ("sub/deeper/b.bin", b"nested"), ("in", b"top")):
        f, size = storage.open_below(str(ckpt), rel)
        with f:
            assert (f.read(), size) == (want, len(want))
    for rel in ("out", "../outside/secret", "sub/../../outside/secret"):
        with pytest.raises(PathEscapesCheckpoint):
            storage.open_below(str(ckpt), rel)
    with pytest.raises(NotARegularFile):
        storage.open_below(str(ckpt), "fifo")
