"""Hashing through mappings in forked workers (drill.integrity.mapped): the same digests as a
read, and a fault in a mapping — SIGBUS — ends a worker, never the drill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import xxhash

import drill.integrity.mapped as mapped
from drill.integrity.parallel import hash_files
from drill.integrity.reading import hash_stream, span_digests
from drill.storage import LocalStorage

CHUNK = 64 << 10


def hash_span(storage: LocalStorage, uri: str, start: int, length: int, chunk: int) -> list[bytes]:
    """The span's digests as a positioned read in this process gives them: the reference."""
    with storage.open(uri) as f:
        return span_digests(f.fileno(), start, length, chunk)


pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are forked on Linux only")


@pytest.fixture
def files(tmp_path: Path) -> dict[str, bytes]:
    data = {"a": os.urandom(5 * CHUNK + 123), "b": os.urandom(3 * CHUNK), "c": os.urandom(17)}
    for name, body in data.items():
        (tmp_path / name).write_bytes(body)
    return data


@pytest.fixture
def forking(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in the drill command: this process may fork its hashing workers."""
    monkeypatch.setattr("drill.proc.may_fork", lambda: True)


def _spans(tmp_path: Path, files: dict[str, bytes]) -> list[tuple[str, int, int]]:
    out = []
    for name, body in files.items():
        for start in range(0, len(body), 2 * CHUNK):
            out.append((str(tmp_path / name), start, min(2 * CHUNK, len(body) - start)))
    return out


@pytest.mark.parametrize("workers", [1, 2, 5])
def test_mapped_spans_hash_as_positioned_reads_do(tmp_path: Path, files: dict[str, bytes], workers: int) -> None:
    storage, spans = LocalStorage(), _spans(tmp_path, files)
    got = mapped.Workers(storage.open_fd, spans, CHUNK, workers).results()
    assert got == [hash_span(storage, uri, a, n, CHUNK) for uri, a, n in spans]


def test_windows_and_chunks_off_the_page_grid_hash_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A span longer than the mapping window, and a chunk size that is not a multiple of the
    page (a manifest may say so), give the digests a read gives."""
    monkeypatch.setattr(mapped, "WINDOW", 3 * 5000)
    body = os.urandom(41_234)
    (tmp_path / "f").write_bytes(body)
    storage, uri = LocalStorage(), str(tmp_path / "f")
    spans = [(uri, 0, 20_000), (uri, 20_000, len(body) - 20_000)]
    assert mapped.Workers(storage.open_fd, spans, 5000, 2).results() == [
        hash_span(storage, u, a, n, 5000) for u, a, n in spans
    ]


def test_hash_files_uses_the_workers_and_matches_a_stream(
    tmp_path: Path, files: dict[str, bytes], forking: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import drill.integrity.parallel as parallel

    monkeypatch.setattr(parallel, "span_digests", lambda *a, **k: pytest.fail("a span was read, not mapped"))
    storage = LocalStorage()
    got = hash_files(storage, str(tmp_path), {n: len(b) for n, b in files.items()}, CHUNK, workers=2)
    for name in files:
        want = hash_stream(storage, str(tmp_path / name), chunk_size=CHUNK)
        assert not isinstance(got[name], OSError) and (got[name].chunks, got[name].size) == (want.chunks, want.size)


@pytest.mark.parametrize("name", ["a", "c"])  # spans of a large file; a small file read whole
def test_a_file_shorter_than_listed_is_read_again_and_reported(
    tmp_path: Path, files: dict[str, bytes], forking: None, name: str
) -> None:
    listed = {n: len(b) for n, b in files.items()} | {name: len(files[name]) + 3}
    got = hash_files(LocalStorage(), str(tmp_path), listed, CHUNK, workers=2)
    assert isinstance(got[name], OSError) and "shrank" in str(got[name])
    assert all(not isinstance(got[n], OSError) for n in files if n != name)


def test_a_worker_killed_by_sigbus_loses_only_the_spans_it_had_not_reported(
    tmp_path: Path, files: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    storage, spans = LocalStorage(), _spans(tmp_path, files)
    real = mapped._digests

    def dies_on_b(open_fd, uri, start, length, chunk, *rest):
        if uri.endswith("/b"):
            os.kill(os.getpid(), signal.SIGBUS)
        return real(open_fd, uri, start, length, chunk, *rest)

    monkeypatch.setattr(mapped, "_digests", dies_on_b)
    got = mapped.Workers(storage.open_fd, spans, CHUNK, workers=len(spans)).results()
    for (uri, a, n), digests in zip(
        spans, got, strict=False
    ):  # what the dead worker had not reported is unreported, the rest exact
        assert digests is None if uri.endswith("/b") else digests in (None, hash_span(storage, uri, a, n, CHUNK))
    assert sum(d is not None for d in got) > 0


def test_a_fork_that_fails_leaves_its_spans_to_the_reads(
    tmp_path: Path, files: dict[str, bytes], forking: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under strict overcommit a large process may not fork: the hashing still completes."""
    import errno

    def no_memory() -> int:
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(mapped.os, "fork", no_memory)
    storage = LocalStorage()
    got = hash_files(storage, str(tmp_path), {n: len(b) for n, b in files.items()}, CHUNK, workers=2)
    for name in files:
        assert (
            not isinstance(got[name], OSError)
            and got[name].chunks == hash_stream(storage, str(tmp_path / name), chunk_size=CHUNK).chunks
        )


def test_the_workers_death_signal_is_resolved_before_they_are_forked(
    tmp_path: Path, files: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker arms its death signal without importing or loading anything: the parent
    resolved the call before the fork (an import in the child could wait forever on a module
    lock another thread held at the fork, and costs each worker 4-7 ms)."""
    import drill.proc as proc

    monkeypatch.setattr(proc, "_death_signal", None)
    resolved_at_fork: list[bool] = []
    real = os.fork

    def fork() -> int:
        resolved_at_fork.append(proc._death_signal is not None)
        return real()

    monkeypatch.setattr(mapped.os, "fork", fork)
    storage, spans = LocalStorage(), _spans(tmp_path, files)
    assert mapped.Workers(storage.open_fd, spans, CHUNK, 2).results() == [
        hash_span(storage, uri, a, n, CHUNK) for uri, a, n in spans
    ]
    assert resolved_at_fork == [True, True]


def test_a_child_dies_with_its_parent_without_importing_anything() -> None:
    """``die_with_parent`` in a forked child, with every import refused: the kernel is told
    to kill the child when the parent ends (``PR_GET_PDEATHSIG`` says SIGKILL)."""
    import builtins
    import ctypes

    from drill.proc import death_signal, die_with_parent

    death_signal()
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        code = 1
        try:
            real_import = builtins.__import__

            def refuse(name: str, *args: object, **kwargs: object) -> object:
                raise ImportError(f"the child imported {name}")

            builtins.__import__ = refuse
            try:
                die_with_parent(parent)
            finally:
                builtins.__import__ = real_import
            armed = ctypes.c_int(0)
            ctypes.CDLL(None, use_errno=True).prctl(2, ctypes.byref(armed))  # PR_GET_PDEATHSIG
            os.write(write_fd, str(armed.value).encode())
            code = 0
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            os.write(write_fd, repr(exc).encode())
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        said = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, said
    assert said == str(int(signal.SIGKILL))


def test_a_file_truncated_under_the_mapping_is_a_changed_file(
    tmp_path: Path, files: dict[str, bytes], forking: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real fault: the file is cut while a worker reads its mapping. The worker dies of
    SIGBUS; the drill re-reads the span and reports the file as changed."""
    victim = str(tmp_path / "a")

    class Cutting:
        def xxh3_128(self, view):
            os.truncate(victim, 0)
            import xxhash

            return xxhash.xxh3_128(view)

    monkeypatch.setattr(mapped, "xxhash", Cutting())
    monkeypatch.setattr(mapped, "SMALL_SPAN", 0)  # every span through a mapping, however small
    got = hash_files(LocalStorage(), str(tmp_path), {"a": len(files["a"])}, CHUNK, workers=2)
    assert isinstance(got["a"], OSError) and "shrank" in str(got["a"])


@pytest.mark.slow
def test_the_drill_command_hashes_through_workers_and_names_damage(tmp_path: Path, files: dict[str, bytes]) -> None:
    """`drill verify` as a process: workers used (no thread reads a span), damage located to its
    chunk, no worker left behind."""
    from drill.integrity.manifest import seal_files as seal

    seal(str(tmp_path), chunk_size=CHUNK)
    with open(tmp_path / "a", "r+b") as f:
        f.seek(3 * CHUNK + 7)
        f.write(bytes([f.read(1)[0] ^ 0xFF]))
    code = (
        "import sys, drill.integrity.parallel as p\n"
        "p.span_digests = lambda *a, **k: sys.exit('a span was read, not mapped')\n"
        f"sys.argv = ['drill', 'verify', {str(tmp_path)!r}, '--db', {str(tmp_path.parent / (tmp_path.name + '.db'))!r}, '--json']\n"
        "from drill.cli import main\nmain()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    (finding,) = [f for f in doc["findings"] if f["severity"] == "error"]
    assert (
        finding["subject"] == "a" and f"{3 * CHUNK}" in finding["message"] and f"{4 * CHUNK}" in finding["message"]
    ), finding


def test_more_spans_than_a_pipe_holds_are_all_hashed_by_whichever_worker_is_free(tmp_path: Path) -> None:
    """Spans go to workers through a job queue (a free worker takes the next), in runs when
    there are more than the queue holds: every span is reported, with the digests a
    positioned read gives."""
    chunk = 64
    n = mapped.MAX_JOBS + 37
    data = os.urandom(chunk * n)
    (tmp_path / "f").write_bytes(data)
    uri = str(tmp_path / "f")
    spans = [(uri, i * chunk, chunk) for i in range(n)]
    got = mapped.Workers(LocalStorage().open_fd, spans, chunk, workers=3).results()
    assert all(g is not None for g in got)
    assert [d for g in got for d in g] == hash_span(LocalStorage(), uri, 0, len(data), chunk)


def test_workers_leave_the_cores_other_work_keeps_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    import drill.integrity.parallel as parallel

    monkeypatch.setattr(parallel, "usable_cores", lambda cap: 4)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    for others, expected in ((0, 4), (1, 3), (2, 2), (4, 1), (40, 1)):
        monkeypatch.setattr(parallel, "others_running", lambda others=others: others)
        assert parallel.free_cores(8) == expected, others


def test_a_core_held_now_is_seen_and_one_held_a_minute_ago_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cores are counted busy by what runs now, not by the load average: a drill run right
    after another (a nightly loop, a benchmark's rounds) would otherwise count the one before
    it as still holding a core, and hash on fewer workers than the cores it has."""
    import drill.integrity.parallel as parallel

    spinning = tmp_path / "spinning"
    spinner = subprocess.Popen([sys.executable, "-c", f"open({str(spinning)!r}, 'w').close()\nwhile True: pass"])
    try:
        while not spinning.exists():  # the spinner has reached its loop
            assert spinner.poll() is None
            os.sched_yield()
        assert max(parallel.others_running() for _ in range(50)) >= 1
    finally:
        spinner.kill()
        spinner.wait()

    queue = tmp_path / "loadavg"
    monkeypatch.setattr(parallel, "RUN_QUEUE", str(queue))
    monkeypatch.setattr(parallel, "usable_cores", lambda cap: 2)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    queue.write_text("40.00 40.00 40.00 1/300 4242\n")  # a busy minute, only this task running now
    assert parallel.others_running() == 0 and parallel.free_cores(8) == 2
    queue.write_text("0.00 0.00 0.00 2/300 4242\n")  # one other task running now
    assert parallel.others_running() == 1 and parallel.free_cores(8) == 1


@pytest.mark.parametrize("mapping", [False, True])
@pytest.mark.parametrize("name", ["c", "a"])
def test_a_file_longer_than_listed_is_read_again_and_reported(
    tmp_path: Path, files: dict[str, bytes], forking: None, name: str, mapping: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker proves the end of each file it reads (the span that ends it: a small one read
    whole, a large one mapped), so the caller takes no ``stat`` of each file after — and a file
    that grew is still found."""
    if mapping:
        monkeypatch.setattr(mapped, "SMALL_SPAN", 0)  # every span through a mapping (the workers are forked after)
    listed = {n: len(b) for n, b in files.items()} | {name: len(files[name]) - 7}
    got = hash_files(LocalStorage(), str(tmp_path), listed, CHUNK, workers=2)
    assert isinstance(got[name], OSError) and f"{len(files[name])} bytes by the end of the read" in str(got[name])
    assert all(not isinstance(got[n], OSError) for n in files if n != name)


@pytest.mark.parametrize(
    "lengths", [[5] * 3, [16 << 10] * 20_000, [1 << 30] + [100] * 1000, [100] * 1000 + [1 << 30], [7]]
)
@pytest.mark.parametrize("workers", [1, 2, 8])
def test_spans_are_handed_out_in_runs_of_about_equal_work(lengths: list[int], workers: int) -> None:
    spans = [("f", 0, n) for n in lengths]
    bounds = mapped.runs(spans, workers)
    assert bounds[0] == 0 and bounds[-1] == len(spans) and bounds == sorted(set(bounds))  # every span, once, in order
    jobs = min(len(spans), mapped.JOBS_PER_WORKER * workers)
    assert len(bounds) - 1 <= jobs + 1
    cost = [n + mapped.SPAN_COST for n in lengths]
    fair = sum(cost) / jobs
    for a, b in zip(bounds, bounds[1:], strict=False):  # a run is over its share by one span at most
        assert sum(cost[a:b]) - max(cost[a:b]) <= fair


def test_reports_cut_anywhere_yield_exactly_the_spans_written_whole() -> None:
    """A worker that dies mid-write leaves a partial report: every complete one before it is
    taken (one digest or many), the partial one and anything naming no span never are."""
    digests = {0: [b"a" * 16], 2: [b"b" * 16, b"c" * 16, b"d" * 16], 1: [b"e" * 16]}
    stream = b"".join(mapped._HEAD.pack(i, len(d)) + b"".join(d) for i, d in digests.items())
    ends, at = [], 0
    for d in digests.values():
        at += mapped._HEAD.size + 16 * len(d)
        ends.append(at)
    for cut in range(len(stream) + 1):
        done: list[list[bytes] | None] = [None] * 3
        mapped._parse(bytearray(stream[:cut]), done)
        whole = [i for i, end in zip(digests, ends, strict=True) if end <= cut]
        assert done == [digests[i] if i in whole else None for i in range(3)], cut
    done = [None] * 2
    mapped._parse(bytearray(stream), done)  # index 2 is past the spans: nothing after it is trusted
    assert done == [digests[0], None]


def test_workers_hash_on_while_their_caller_does_other_work(tmp_path: Path) -> None:
    """Started workers do not wait for the caller to read their reports: thousands of small
    files' digests fit the pipe, so each worker finishes — here it is waited for before a byte
    is read — and the caller collects every span's digests after."""
    import fcntl

    probe_r, probe_w = os.pipe()
    try:
        fcntl.fcntl(probe_r, fcntl.F_SETPIPE_SZ, mapped.PIPE_BYTES)
    except OSError:
        pytest.skip("this system does not let a pipe grow to 1 MiB")
    finally:
        os.close(probe_r)
        os.close(probe_w)
    storage = LocalStorage()
    for i in range(6000):
        (tmp_path / f"f{i}").write_bytes(i.to_bytes(4, "little"))
    spans = [(str(tmp_path / f"f{i}"), 0, 4) for i in range(6000)]  # 24 bytes a report: 144 KB
    workers = mapped.Workers(storage.open_fd, spans, CHUNK, 2)
    try:
        for pid in workers._pids:
            _, status = os.waitpid(pid, 0)  # blocks forever on a worker stuck writing to a full pipe
            assert os.waitstatus_to_exitcode(status) == 0
        got = workers.results()
    finally:
        workers.stop()
    assert got == [hash_span(storage, uri, a, n, CHUNK) for uri, a, n in spans]


def test_every_worker_but_the_first_hashes_at_a_lower_priority(tmp_path: Path, files: dict[str, bytes]) -> None:
    """The first worker hashes at its caller's CPU priority, every other one
    BACKGROUND_NICE lower (the caller's own work comes first on a busy core) — and all of
    them report the same digests. Each worker says when it opens its first file and waits
    there, so the priorities are read while all three are alive."""
    ready_r, ready_w = os.pipe()
    gate_r, gate_w = os.pipe()

    def opener(uri: str) -> int:  # in the worker
        os.write(ready_w, b"!")
        os.read(gate_r, 1)
        return os.open(uri, os.O_RDONLY)

    storage = LocalStorage()
    spans = [(str(tmp_path / name), 0, len(body)) for name, body in files.items()]
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    workers = mapped.Workers(opener, spans, CHUNK, 3)
    try:
        assert len(workers._pids) == 3
        seen = b""
        while len(seen) < 3:  # each worker took one span and waits at its first open
            seen += os.read(ready_r, 3 - len(seen))
        priorities = [os.getpriority(os.PRIO_PROCESS, pid) for pid in workers._pids]
        os.write(gate_w, b"!" * len(spans))
        got = workers.results()
    finally:
        workers.stop()
        for fd in (ready_r, ready_w, gate_r, gate_w):
            os.close(fd)
    assert priorities == [mine] + [min(19, mine + mapped.BACKGROUND_NICE)] * 2
    assert got == [hash_span(storage, uri, a, n, CHUNK) for uri, a, n in spans]


def _small_files(tmp_path: Path, n: int) -> dict[str, bytes]:
    data = {f"f{i:03d}": os.urandom(100 + i) for i in range(n)}
    for name, body in data.items():
        (tmp_path / name).write_bytes(body)
    return data


@pytest.mark.parametrize("workers", [1, 3])
def test_a_worker_reports_as_sealed_only_what_is_exactly_as_sealed(tmp_path: Path, workers: int) -> None:
    """Handed each small file's sealed digest, a worker reports a file that matches it
    AS_SEALED and every other file by its digests, as without a seal: a byte changed, a
    file longer or shorter than sealed, one the seal does not name, one sealed with another
    digest — whatever runs of matches lie between them."""
    from drill.integrity.hashing import AS_SEALED

    data = _small_files(tmp_path, 40)
    sizes = {name: len(body) for name, body in data.items()}
    sealed = {name: xxhash.xxh3_128_hexdigest(body) for name, body in data.items()}
    (tmp_path / "f003").write_bytes(b"X" + data["f003"][1:])  # a byte changed
    (tmp_path / "f010").write_bytes(data["f010"] + b"!")  # longer than sealed
    (tmp_path / "f011").write_bytes(data["f011"][:-1])  # shorter
    del sealed["f020"]  # not named by the seal
    sealed["f030"] = "0" * 32  # sealed with another digest
    opener = LocalStorage().beneath(str(tmp_path))
    spans = [(name, 0, size) for name, size in sizes.items()]
    got = mapped.Workers(opener, spans, CHUNK, workers, sizes=sizes, sealed=sealed).results()
    differ = {"f003", "f010", "f011", "f020", "f030"}
    assert [name for (name, _, _), g in zip(spans, got, strict=True) if g is AS_SEALED] == [
        name for name in sizes if name not in differ
    ]
    for (name, _, _), g in zip(spans, got, strict=True):
        if name in ("f003", "f020", "f030"):  # read at the sealed size: its digest, to compare
            assert g == [xxhash.xxh3_128_digest((tmp_path / name).read_bytes())]
        elif name in ("f010", "f011"):  # another size: left to the checked read, which names it
            assert g is None


def test_a_garbled_run_of_matches_is_not_taken() -> None:
    """A run that reaches past the spans (a worker's report cut or garbled) marks nothing."""
    done: list = [None] * 4
    mapped._parse(bytearray(mapped._HEAD.pack(2 | mapped._AS_SEALED, 3)), done)
    assert done == [None] * 4
    mapped._parse(bytearray(mapped._HEAD.pack(1 | mapped._AS_SEALED, 3)), done)
    assert done[0] is None and all(d is not None for d in done[1:])
