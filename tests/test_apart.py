"""A directory listed in a forked child (drill.storage.apart): the very entries the storage
lists in place, for every kind of entry; nothing (and the caller lists it) where the child
fails or dies, or holds more than asked; never a child left behind; and only in a process drill
owns, for a directory of thousands of entries."""

from __future__ import annotations

import marshal
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from drill.storage import LocalStorage
from drill.storage.apart import MANY_ENTRIES, list_apart
from drill.storage.listed import ListedOnce

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forked on Linux only")


@pytest.fixture
def forking(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in the drill command, for a directory of any size."""
    monkeypatch.setattr("drill.proc.may_fork", lambda: True)
    monkeypatch.setattr("drill.storage.apart.MANY_ENTRIES", 0)


def _no_child() -> None:
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)  # none running, none unreaped


@pytest.fixture
def odd(tmp_path: Path) -> Path:
    """A directory of every kind of entry a listing tells apart."""
    d = tmp_path / "ckpt"
    d.mkdir()
    for i in range(300):
        (d / f"__{i}_0.distcp").write_bytes(b"x" * i)
    (d / "sub").mkdir()
    (d / "empty").write_bytes(b"")
    (d / "to-file").symlink_to("__7_0.distcp")
    (d / "dangling").symlink_to("nowhere")
    (d / "loop").symlink_to("loop")
    os.mkfifo(d / "fifo")
    (d / "caf\u00e9 \u2014 \U0001f600.pt").write_bytes(b"unicode")
    os.close(os.open(os.fsencode(d) + b"/raw-\xff\xfe.bin", os.O_CREAT | os.O_WRONLY, 0o644))  # not UTF-8
    return d


def test_the_entries_are_those_listed_in_place_for_every_kind(odd: Path, forking: None) -> None:
    storage = LocalStorage()
    apart = list_apart(storage, str(odd), 10_000)
    assert apart is not None
    assert apart.entries() == storage.list(str(odd))
    _no_child()


def test_an_empty_directory_lists_empty(tmp_path: Path, forking: None) -> None:
    apart = list_apart(LocalStorage(), str(tmp_path), 10)
    assert apart is not None and apart.entries() == []


def test_more_entries_than_asked_is_nothing(odd: Path, forking: None) -> None:
    apart = list_apart(LocalStorage(), str(odd), 10)
    assert apart is not None and apart.entries() is None
    _no_child()


class _Failing(LocalStorage):
    def list(self, uri: str) -> list:  # type: ignore[override]
        raise RuntimeError("the child fails")


@pytest.mark.parametrize(
    "sent",
    [
        lambda whole: whole[: len(whole) // 2],  # died mid-write
        lambda whole: whole[:-1],
        lambda whole: b"",  # died before writing
        lambda whole: marshal.dumps((3, b"a\0b", b"a\0b\0c", b"\0\0\0", b"", b"", {})),  # counts that disagree
        lambda whole: marshal.dumps((1, b"a", b"a", b"\x09", b"\0" * 8, b"\0" * 8, {})),  # no such kind
        lambda whole: marshal.dumps([1, 2, 3]),
    ],
    ids=["half", "all but a byte", "nothing", "counts disagree", "unknown kind", "another shape"],
)
def test_a_child_that_dies_or_sends_anything_but_a_whole_listing_is_nothing_and_it_is_listed_in_place(
    odd: Path, forking: None, monkeypatch: pytest.MonkeyPatch, sent: Callable[[bytes], bytes]
) -> None:
    import drill.storage.apart as apart_module

    real = apart_module._encoded
    monkeypatch.setattr(apart_module, "_encoded", lambda entries: sent(real(entries)))
    apart = list_apart(LocalStorage(), str(odd), 10_000)
    assert apart is not None and apart.entries() is None
    _no_child()
    listed = ListedOnce(LocalStorage())
    listed.seed(str(odd), apart.entries)
    assert listed.list(str(odd)) == LocalStorage().list(str(odd))


def test_a_child_that_fails_is_nothing(odd: Path, forking: None) -> None:
    apart = list_apart(_Failing(), str(odd), 10_000)
    assert apart is not None and apart.entries() is None
    _no_child()


def test_stopped_while_it_lists_the_child_is_killed_and_reaped(odd: Path, forking: None) -> None:
    gate_r, gate_w = os.pipe()  # the child blocks reading it: a listing that never ends

    class Hung(LocalStorage):
        def list(self, uri: str) -> list:  # type: ignore[override]
            os.close(gate_w)
            os.read(gate_r, 1)  # no writer left in the child... but the parent's end stays open
            return []

    try:
        apart = list_apart(Hung(), str(odd), 10_000)
        assert apart is not None
        apart.stop()
        _no_child()
    finally:
        os.close(gate_r)
        os.close(gate_w)


def test_a_seeded_listing_is_taken_once_and_the_storage_not_asked(odd: Path, forking: None) -> None:
    asked: list[str] = []

    class Counting(LocalStorage):
        def list(self, uri: str) -> list:  # type: ignore[override]
            asked.append(uri)
            return super().list(uri)

    apart = list_apart(LocalStorage(), str(odd), 10_000)
    assert apart is not None
    listed = ListedOnce(Counting())
    listed.seed(str(odd), apart.entries)
    assert listed.list(str(odd)) == LocalStorage().list(str(odd)) and listed.list(str(odd)) is listed.list(str(odd))
    assert asked == []
    listed.seed(str(odd / "sub"), lambda: None)  # nothing from elsewhere: listed here
    assert listed.list(str(odd / "sub")) == [] and asked == [str(odd / "sub")]


def test_only_a_process_drill_owns_lists_apart_and_only_a_directory_of_thousands(
    odd: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = LocalStorage()
    assert list_apart(storage, str(odd), 10_000) is None  # pytest's process: drill may not fork it
    monkeypatch.setattr("drill.proc.may_fork", lambda: True)
    small = os.stat(odd).st_size < MANY_ENTRIES
    assert small and list_apart(storage, str(odd), 10_000) is None  # a few hundred entries: in place
    monkeypatch.setattr("drill.storage.apart.MANY_ENTRIES", 0)
    assert list_apart(storage, str(odd / "__1_0.distcp"), 10) is None  # not a directory
    assert list_apart(storage, str(odd / "missing"), 10) is None


def test_stopped_before_it_is_asked_the_entries_are_nothing(odd: Path, forking: None) -> None:
    apart = list_apart(LocalStorage(), str(odd), 10_000)
    assert apart is not None
    apart.stop()
    assert apart.entries() is None
    _no_child()


def test_what_the_child_is_asked_first_comes_first_and_the_listing_after(odd: Path, forking: None) -> None:
    storage = LocalStorage()
    names = {p.name for p in odd.iterdir()} | {os.fsdecode(b"raw-\xff\xfe.bin")}
    apart = list_apart(storage, str(odd), 10_000, first=lambda: {e.name for e in storage.list(str(odd))})
    assert apart is not None
    assert apart.first() == (True, names)  # the undecodable name too
    assert apart.first() == (False, None)  # once
    assert apart.entries() == storage.list(str(odd))
    _no_child()
    unasked = list_apart(storage, str(odd), 10_000, first=lambda: None)
    assert unasked is not None and unasked.entries() == storage.list(str(odd))  # first, never asked for: skipped
    plain = list_apart(storage, str(odd), 10_000)
    assert plain is not None and plain.first() == (False, None)  # nothing asked first
    plain.stop()
    _no_child()


def test_a_child_that_dies_before_it_answers_first_leaves_both_to_the_caller(odd: Path, forking: None) -> None:
    def dies() -> object:
        os._exit(3)

    apart = list_apart(LocalStorage(), str(odd), 10_000, first=dies)
    assert apart is not None
    assert apart.first() == (False, None) and apart.entries() is None
    _no_child()
