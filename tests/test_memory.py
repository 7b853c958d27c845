"""Memory a restore or a verification makes (drill.memory): the collector paused while it is
made and back as it was after; a fresh target's pages faulted in ahead of the reads, present
afterwards, unchanged, and nothing done where the kernel cannot."""

from __future__ import annotations

import ctypes
import gc
import mmap
import sys
from pathlib import Path

import pytest

from drill import memory
from drill.errors import NothingToDrill
from drill.verifier import verify_checkpoint

PAGE = mmap.PAGESIZE


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:"))


def _address(buf: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux's")
def test_populate_brings_a_fresh_region_in_and_changes_no_byte() -> None:
    size = 64 << 20
    buf = mmap.mmap(-1, size)
    buf[:5] = b"drill"  # one page already in, with data on it
    before = _rss()
    if not memory.populate(_address(buf), size):
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux < 5.14)")
    assert _rss() - before >= size - (1 << 20)  # the whole region is in memory now
    assert buf[:5] == b"drill" and buf[5 : 1 << 20] == bytes((1 << 20) - 5) and buf[-4096:] == bytes(4096)


class _Libc:
    """The C library as :func:`drill.memory.populate` asks it: ``madvise`` recorded, ``mincore``
    the kernel's own (or, with ``resident=False``, saying no page is in memory)."""

    def __init__(self, resident: bool | None = None) -> None:
        self.calls: list[tuple[int, int, int]] = []
        self.resident = resident
        self.real = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None

    def madvise(self, address: int, length: int, how: int) -> int:
        self.calls.append((address, length, how))
        return 0

    def mincore(self, address: int, length: int, vec: object) -> int:
        if self.resident is False:
            ctypes.memset(vec, 0, length // memory._PAGE)
            return 0
        assert self.real is not None
        self.real.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        return self.real.mincore(address, length, vec)


def _fake(monkeypatch: pytest.MonkeyPatch, resident: bool | None = None) -> _Libc:
    libc = _Libc(resident)
    monkeypatch.setattr(memory, "_libc", libc)
    return libc


def test_partial_pages_and_empty_ranges_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    libc = _fake(monkeypatch, resident=False)
    page = memory._PAGE
    assert not memory.populate(page + 1, page)  # no whole page inside
    assert memory.populate(page + 1, 3 * page)
    assert libc.calls == [(2 * page, 2 * page, 23)]  # the whole pages within, never a byte outside
    monkeypatch.setattr(memory, "_libc", None)
    assert not memory.populate(page, 8 * page)  # a system without it: the reads fault as before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore and MADV_POPULATE_WRITE are Linux's")
def test_only_the_windows_not_yet_in_memory_are_populated(monkeypatch: pytest.MonkeyPatch) -> None:
    """A live trainer's targets are in memory already: populating them again walks every page
    for nothing (0.3 GB: 15-30 ms of a core during the read). Each window is asked first."""
    window = 1 << 20
    monkeypatch.setattr(memory, "_WINDOW", window)
    libc = _fake(monkeypatch)
    buf = mmap.mmap(-1, 4 * window)
    base = _address(buf)
    assert base % memory._PAGE == 0
    for at in range(0, 2 * window, memory._PAGE):  # the first two windows touched, as a trainer's
        buf[at] = 1
    buf[3 * window] = 1  # one page of the last window: the rest of it still wants populating
    assert memory.populate(base, 4 * window)
    assert libc.calls == [(base + 2 * window, window, 23), (base + 3 * window, window, 23)]
    libc.calls.clear()
    assert memory.populate(base, 2 * window) and libc.calls == []  # all in memory: nothing asked


@pytest.mark.parametrize("planner", ["drill run's", "drill.sdk.load's"])
def test_the_next_target_is_populated_ahead_only_for_drills_own_planners(
    monkeypatch: pytest.MonkeyPatch, planner: str
) -> None:
    """While the reader fills one target, the next one's pages are faulted in on the lane's
    populating threads — asked of drill's planners only (a user's may allocate on each call):
    a drill's own, and the SDK's (DCP's planner, whose targets are the state dict's own);
    only for a large target in host memory; the entry then skips its own populate."""
    import threading

    import torch

    import drill.integrity.reading as reading
    from drill.formats import dcp_read
    from drill.formats.dcp_types import LoadItemType, MetadataIndex, ReadItem

    done = threading.Event()
    asked: list[tuple[int, int]] = []

    def record(address: int, length: int) -> bool:
        asked.append((address, length))
        if sum(n for _, n in asked) >= dcp_read.LANE_MIN:  # every part of the big target
            done.set()
        return True

    monkeypatch.setattr(reading, "populate", record)
    # a fresh target, whatever the allocator hands out: an 8 MiB tensor may reuse pages a
    # test before freed, already in memory, which the lane rightly never hands over
    monkeypatch.setattr(reading, "in_memory", lambda at, n: False)
    big, small = torch.empty(dcp_read.LANE_MIN // 4, dtype=torch.float32), torch.empty(16)
    state = {"big": big, "small": small}

    def item(fqn: str, n: int) -> ReadItem:
        index = MetadataIndex(fqn, torch.Size([0]))
        return ReadItem(LoadItemType.TENSOR, index, index, torch.Size([0]), torch.Size([0]), torch.Size([n]))

    class Users:  # any planner that is not drill's: never asked ahead
        def resolve_tensor(self, read_item: object) -> torch.Tensor:
            raise AssertionError("a user's planner was asked for a target ahead of its entry")

    if planner == "drill run's":
        ours: object = dcp_read.TargetPlanner(state, [])
    else:
        from drill.formats.dcp_reader import SafeLoadPlanner

        ours = SafeLoadPlanner([])
        ours.set_up_planner(state, None, True)  # type: ignore[attr-defined]
    outcome = dcp_read._FileOutcome(dcp_read.FileRead("f", None))
    try:
        dcp_read._populate_ahead(item("big", big.numel()), Users(), outcome)
        dcp_read._populate_ahead(item("small", 16), ours, outcome)
        assert not outcome.populated
        dcp_read._populate_ahead(item("big", big.numel()), ours, outcome)
        assert done.wait(60) and outcome.populated == {big.data_ptr()}
        assert min(asked)[0] == big.data_ptr() and sum(n for _, n in asked) == big.numel() * 4
    finally:
        outcome.lane.close()


@pytest.mark.parametrize("enabled", [True, False])
def test_a_verification_runs_with_the_collector_paused_and_leaves_it_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, enabled: bool
) -> None:
    import drill.verifier as verifier

    seen = []
    real = verifier.classify
    monkeypatch.setattr(verifier, "classify", lambda *a: seen.append(gc.isenabled()) or real(*a))
    (tmp_path / "ckpt").mkdir()
    (gc.enable if enabled else gc.disable)()
    try:
        with pytest.raises(NothingToDrill):  # an empty directory: ends in an error, still restored
            verify_checkpoint(str(tmp_path / "ckpt"))
        assert seen == [False] and gc.isenabled() is enabled
    finally:
        gc.enable()


class _Made:
    """A container the collector tracks."""


@pytest.mark.parametrize("claimed", [True, False])
def test_kept_pauses_the_collector_then_freezes_what_was_made_only_in_a_process_drill_owns(
    monkeypatch: pytest.MonkeyPatch, claimed: bool
) -> None:
    """drill's command line freezes what it keeps (no later collection walks a 20,000-file
    seal again); a library's host — pytest here, a trainer — is never frozen, only paused."""
    monkeypatch.setattr("drill.proc._claimed", claimed)
    gc.unfreeze()
    try:
        with memory.kept():
            assert not gc.isenabled()
            made = [_Made() for _ in range(1000)]
        assert gc.isenabled()
        frozen = gc.get_freeze_count()
        assert (frozen >= len(made)) is claimed and (frozen == 0) is not claimed
        gc.disable()
        with memory.kept():
            pass
        assert not gc.isenabled()  # left as it was found
    finally:
        gc.unfreeze()
        gc.enable()


def test_the_console_script_freezes_what_it_loads_and_begins(tmp_path: Path) -> None:
    """``drill``'s imports and a head start's seal are made once and kept: frozen, not walked
    by each collection the command makes after (the process is drill's own)."""
    import subprocess

    probe = (
        "import gc, sys, drill.cli.app as app\n"
        "def run():\n"
        "    print(gc.get_freeze_count(), gc.isenabled())\n"
        "app.main = run\n"
        "sys.argv = ['drill', '--version']\n"
        "from drill.cli import main\n"
        "main()\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path)
    frozen, enabled = out.stdout.split()
    assert int(frozen) > 10_000 and enabled == "True"


@pytest.mark.parametrize(
    ("address", "length"),
    [
        (10 * PAGE, 100 * PAGE),
        (10 * PAGE + 5, 100 * PAGE + 7),
        (3 * PAGE + 1, 100),
        (16 * PAGE, 1),
        (PAGE - 1, 2 * PAGE),
    ],
)
def test_a_target_is_populated_in_parts_that_cover_it_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch, address: int, length: int
) -> None:
    """The lane's threads each fault in a part of a target: together every byte of it, none
    outside it, and the cuts between parts on page boundaries (a page cut in two would be
    whole in neither part: left to the reads)."""
    from drill.integrity import reading

    asked: list[tuple[int, int]] = []
    monkeypatch.setattr(reading, "populate", lambda at, n: asked.append((at, n)))
    monkeypatch.setattr(reading, "in_memory", lambda at, n: False)  # a fresh target
    lane = reading.CrcLane()
    lane.populate(address, length)
    threads = list(lane._populators)
    lane.close()
    for thread in threads:
        thread.join()
    asked.sort()
    assert asked[0][0] == address and sum(n for _, n in asked) == length
    assert all(at + n == nxt for (at, n), (nxt, _) in zip(asked, asked[1:], strict=False))
    assert all(at % PAGE == 0 for at, _ in asked[1:])
    if length >= 2 * reading.POPULATORS * PAGE:
        assert len(asked) == reading.POPULATORS


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore is asked on Linux")
def test_a_target_already_in_memory_starts_no_populating_thread() -> None:
    """A live trainer's target (every page in memory) is not handed to the lane's populating
    threads; a fresh one is, and is in memory after."""
    from drill.integrity.reading import CrcLane

    size = 16 << 20
    fresh, touched = mmap.mmap(-1, size), mmap.mmap(-1, size)
    touched.write(b"x" * size)
    assert memory.in_memory(_address(touched), size) and not memory.in_memory(_address(fresh), size)
    lane = CrcLane()
    try:
        lane.populate(_address(touched), size)
        assert lane._populators == []
        lane.populate(_address(fresh), size)
        threads = list(lane._populators)
        assert threads
    finally:
        lane.close()
    for thread in threads:
        thread.join()
    assert memory.in_memory(_address(fresh), size) or not memory.populate(_address(fresh), size)
