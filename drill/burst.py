"""The restore burst: N readers restoring one checkpoint at the same moment, as a restart does.

After a failure every rank of the job reads its checkpoint at once, cold, from shared storage:
the worst read burst the storage sees, and the restart time R that dominates lost goodput at
scale. :func:`burst` measures it on this host: for each reader count of a sweep (1, 2, 4, …)
it starts that many reader processes, drops the checkpoint from the page cache (``cold``),
releases them together from one barrier, and each reads and hashes its share of the files
(balanced by bytes, as a distributed drill assigns them) — or, ``replicated``, every file, as
a rank holding replicated state would. Per reader: bytes, seconds, time to first byte;
aggregate bandwidth over the window from the barrier to the last reader's end; the slowest
reader (the tail decides R). The **ceiling** is where adding readers stops adding bandwidth
(the next step gains less than 10%).

:func:`restart_estimate` turns a burst into R for a whole job: measured fixed costs (a reader
process's start and imports, reading the index) plus the job's checkpoint bytes over
``min(per-reader bandwidth × readers, ceiling)``, stretched by the measured tail (slowest
reader / mean), with the arithmetic spelled out — and a warning when it extrapolates more
than 10× beyond what was measured.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

CEILING_GAIN = 0.10
"""A step whose aggregate bandwidth grows by less than this over the previous one has hit the ceiling."""


@dataclass(slots=True)
class ReaderFigures:
    reader: int
    bytes: int
    started: float
    """``time.monotonic()`` when the barrier released it (comparable across processes on one host)."""
    ended: float
    first_byte: float | None
    files: int
    error: str | None = None

    @property
    def seconds(self) -> float:
        return self.ended - self.started

    @property
    def bandwidth(self) -> float | None:
        return self.bytes / self.seconds if self.seconds > 0 else None


@dataclass(slots=True)
class Step:
    readers: int
    per_reader: list[ReaderFigures]
    startup_seconds: float
    """Median, from launching the readers to each being ready: a new interpreter, its imports,
    opening the storage — what a restarted rank pays before it reads."""
    recorded_window: float | None = None
    """The window as it was measured, for a step read back from the record."""

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.per_reader)

    @property
    def window(self) -> float:
        if self.recorded_window is not None:
            return self.recorded_window
        return max(r.ended for r in self.per_reader) - min(r.started for r in self.per_reader)

    @property
    def aggregate_bps(self) -> float | None:
        return self.bytes / self.window if self.window > 0 else None

    @property
    def slowest_seconds(self) -> float:
        return max(r.seconds for r in self.per_reader)

    @property
    def tail(self) -> float:
        """Slowest reader's seconds over the mean, of the readers that had something to read (a
        reader beyond the file count sits idle: counting it would stretch the tail): 1.0 when
        every reader took as long."""
        busy = [r.seconds for r in self.per_reader if r.bytes > 0] or [r.seconds for r in self.per_reader]
        mean = sum(busy) / len(busy)
        return max(busy) / mean if mean > 0 else 1.0

    @property
    def idle(self) -> int:
        """Readers that had nothing to read (more readers than files)."""
        return sum(1 for r in self.per_reader if r.bytes == 0)

    @property
    def ttfb_seconds(self) -> float | None:
        firsts = [r.first_byte - r.started for r in self.per_reader if r.first_byte is not None]
        return max(firsts) if firsts else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "readers": self.readers, "bytes": self.bytes, "window_seconds": round(self.window, 6), "aggregate_bps": self.aggregate_bps,
            "slowest_seconds": round(self.slowest_seconds, 6), "tail": round(self.tail, 4), "ttfb_seconds": self.ttfb_seconds,
            "startup_seconds": round(self.startup_seconds, 6),
            "per_reader": [{"reader": r.reader, "bytes": r.bytes, "files": r.files, "seconds": round(r.seconds, 6), "bandwidth_bps": r.bandwidth,
                            "ttfb_seconds": None if r.first_byte is None else round(r.first_byte - r.started, 6), "error": r.error}
                           for r in self.per_reader],
        }  # fmt: skip


@dataclass(slots=True)
class BurstResult:
    checkpoint: str
    bytes: int
    files: int
    cold: bool
    replicated: bool
    steps: list[Step] = field(default_factory=list)
    index_seconds: float | None = None
    """Reading the checkpoint's index (``.metadata``, or its smallest file), as every restore does first."""
    rendezvous_seconds: float | None = None
    """As the ranks of a job: joining the rank group (None for reader processes on one host)."""

    @property
    def ceiling(self) -> tuple[float | None, int | None]:
        """(bandwidth, readers) where more readers stopped adding bandwidth; (best, None) when
        every step still gained (the ceiling lies beyond the sweep)."""
        best = max(self.steps, key=lambda s: s.aggregate_bps or 0.0, default=None)
        for prev, nxt in itertools.pairwise(self.steps):
            if (nxt.aggregate_bps or 0.0) < (prev.aggregate_bps or 0.0) * (1 + CEILING_GAIN):
                return (best.aggregate_bps if best else None), prev.readers
        return (best.aggregate_bps if best else None), None

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> BurstResult:
        """A recorded burst back (its document, as :meth:`to_dict` wrote it)."""
        steps = []
        for st in doc["steps"]:
            figures = [ReaderFigures(r["reader"], r["bytes"], 0.0, r["seconds"], None if r["ttfb_seconds"] is None else r["ttfb_seconds"], r["files"], r["error"])
                       for r in st["per_reader"]]  # fmt: skip
            steps.append(Step(st["readers"], figures, st["startup_seconds"], st["window_seconds"]))
        return cls(
            doc["checkpoint"],
            doc["bytes"],
            doc["files"],
            doc["cold"],
            doc["replicated"],
            steps,
            doc.get("index_seconds"),
            doc.get("rendezvous_seconds"),
        )

    def to_dict(self) -> dict[str, Any]:
        bps, readers = self.ceiling
        return {
            "checkpoint": self.checkpoint, "bytes": self.bytes, "files": self.files, "cold": self.cold, "replicated": self.replicated,
            "index_seconds": self.index_seconds, "rendezvous_seconds": self.rendezvous_seconds, "ceiling_bps": bps, "ceiling_readers": readers, "steps": [s.to_dict() for s in self.steps],
        }  # fmt: skip


def _reader(
    n: int,
    checkpoint: str,
    files: list[tuple[str, int]],
    options: dict[str, Any] | None,
    ready: Any,
    go: Any,
    done: Any,
    out: Any,
) -> None:
    """One reader process: import, open the storage, wait for the others, read and hash its files.
    Everything but the reading happens before the barrier: the window is the storage's."""
    import torch  # noqa: F401 - what a restarting rank imports before it can restore: part of the fixed cost

    from drill.integrity import reading  # noqa: F401 - imported before the clock, not inside the window
    from drill.storage import storage_for

    storage = storage_for(checkpoint, options)
    ready.put((n, time.monotonic()))
    go.wait()
    out.put(_read_share(storage, checkpoint, files, n))
    # A reader that is done waits for the others: its exit (a torch interpreter's teardown) would
    # take a core from the readers still inside the window. A reader that died breaks the wait.
    with contextlib.suppress(threading.BrokenBarrierError):
        done.wait(timeout=3600)


def _shares(sizes: dict[str, int], readers: int, replicated: bool) -> list[list[tuple[str, int]]]:
    from drill.restore.partition import assign

    if replicated:
        return [sorted(sizes.items())] * readers
    return [[(rel, sizes[rel]) for rel in share] for share in assign(sizes, readers)]


def run_step(
    checkpoint: str,
    sizes: dict[str, int],
    readers: int,
    *,
    cold: bool,
    replicated: bool,
    options: dict[str, Any] | None = None,
) -> Step:
    """One step of the sweep: ``readers`` processes released together from one barrier. Cold, the
    checkpoint leaves the page cache once every reader is ready, just before the barrier: every
    step reads from the same state, however long its readers took to start (on a VM, storage
    below the guest's cache forgets within seconds of a drop, so a drop before a slow start
    would make the steps with more readers read colder)."""
    from drill.storage import storage_for

    storage = storage_for(checkpoint, options)
    ctx = multiprocessing.get_context("spawn")  # torch-free children: nothing inherited, nothing forked mid-thread
    ready, out, go, done = ctx.Queue(), ctx.Queue(), ctx.Barrier(readers + 1), ctx.Barrier(readers)
    procs = [ctx.Process(target=_reader, args=(n, checkpoint, share, options, ready, go, done, out), daemon=True)
             for n, share in enumerate(_shares(sizes, readers, replicated))]  # fmt: skip
    launched = time.monotonic()
    for p in procs:
        p.start()
    try:
        startups = sorted(ready.get(timeout=600)[1] - launched for _ in procs)
        if cold:
            storage.evict({storage.child(checkpoint, rel): size for rel, size in sizes.items()})
        go.wait(timeout=600)
        figures = sorted((out.get(timeout=3600) for _ in procs), key=lambda r: r.reader)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return Step(readers, figures, startups[len(startups) // 2])


def _read_share(storage: Any, checkpoint: str, files: list[tuple[str, int]], n: int) -> ReaderFigures:
    """Read and hash one reader's files through a storage opened before the clock started."""
    from drill.integrity.reading import hash_stream

    first: list[float] = []

    def seen(nbytes: int) -> None:
        if not first:
            first.append(time.monotonic())

    started, done, error = time.monotonic(), 0, None
    for rel, size in files:
        try:
            done += hash_stream(storage, storage.child(checkpoint, rel), size, on_bytes=seen).size
        except OSError as exc:
            error = f"{rel}: {exc.strerror or exc}"
            break
    return ReaderFigures(n, done, started, time.monotonic(), first[0] if first else None, len(files), error)


def run_step_on_ranks(
    dist: Any,
    checkpoint: str,
    sizes: dict[str, int],
    readers: int,
    *,
    cold: bool,
    replicated: bool,
    options: dict[str, Any] | None = None,
    startup: float = 0.0,
) -> Step | None:
    """One step of the sweep as ranks of a job (torchrun, srun, an indexed Job): ranks below
    ``readers`` each read their share, released together through the rank group; rank 0 gets
    the step (others None). Start-up is rank 0's: its process's age when it joined."""
    from drill.integrity import reading as _  # noqa: F401 - imported before the clock
    from drill.storage import storage_for

    reading = dist.rank < readers
    share = _shares(sizes, readers, replicated)[dist.rank] if reading else []
    storage = storage_for(checkpoint, options)
    if cold and reading:
        storage.evict({storage.child(checkpoint, rel): size for rel, size in share})  # this node's page cache
    dist.gather(None, f"burst-ready-{readers}")
    dist.broadcast(None, f"burst-go-{readers}")  # the barrier: every reader starts now
    figures = _read_share(storage, checkpoint, share, dist.rank) if reading else None
    gathered = dist.gather(figures, f"burst-done-{readers}")
    if gathered is None:
        return None
    wall = [f for f in gathered if f is not None]
    # monotonic clocks of different nodes do not compare: each reader's window is its own
    return Step(readers, sorted(wall, key=lambda r: r.reader), startup, recorded_window=max(r.seconds for r in wall))


def burst(checkpoint: str, *, readers: list[int], cold: bool = True, replicated: bool = False, options: dict[str, Any] | None = None, on_step: Any = None,
          dist: Any = None, joining: tuple[float, float] | None = None) -> BurstResult | None:  # fmt: skip
    """Sweep the reader counts over one checkpoint (see the module). With ``dist`` (a rank
    group, :func:`drill.dist.context.connect`) the readers are the job's ranks, on their own
    nodes; rank 0 gets the result, the others None. ``joining``: (seconds from the process's
    start to joining, seconds the rendezvous took), measured by the caller around ``connect``."""
    from drill.integrity.manifest import MANIFEST_NAME, list_files
    from drill.storage import storage_for

    storage = storage_for(checkpoint, options)
    sizes = {rel: size for rel, size in list_files(storage, checkpoint).files.items() if rel != MANIFEST_NAME}
    if not sizes:
        raise ValueError(f"{checkpoint}: no files to read")
    result = BurstResult(checkpoint, sum(sizes.values()), len(sizes), cold, replicated)
    result.index_seconds = _index_seconds(storage, checkpoint, sizes, cold)
    if joining is not None:
        result.rendezvous_seconds = joining[1]
    for n in readers:
        if dist is not None:
            step = run_step_on_ranks(
                dist,
                checkpoint,
                sizes,
                n,
                cold=cold,
                replicated=replicated,
                options=options,
                startup=joining[0] if joining else 0.0,
            )
            if step is None:
                continue
        else:
            step = run_step(checkpoint, sizes, n, cold=cold, replicated=replicated, options=options)
        result.steps.append(step)
        if on_step is not None:
            on_step(step)
    return result if dist is None or dist.is_root else None


def _index_seconds(storage: Any, checkpoint: str, sizes: dict[str, int], cold: bool) -> float:
    from drill.integrity.reading import hash_stream

    index = ".metadata" if ".metadata" in sizes else min(sizes, key=lambda rel: (sizes[rel], rel))
    uri = storage.child(checkpoint, index)
    if cold:
        storage.evict({uri: sizes[index]})
    started = time.perf_counter()
    hash_stream(storage, uri, sizes[index])
    return time.perf_counter() - started


@dataclass(frozen=True, slots=True)
class RestartEstimate:
    restart_s: float
    fixed_s: float
    read_s: float
    tail: float
    bandwidth_bps: float
    """The job's aggregate read bandwidth: min(per-reader × readers, ceiling)."""
    explanation: list[str]
    warnings: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def restart_estimate(
    result: BurstResult,
    *,
    job_bytes: int | None = None,
    job_readers: int | None = None,
    storage_bps: float | None = None,
) -> RestartEstimate:
    """R for a whole job from a burst (docs/goodput.md, "The model"):

    - read = job bytes / min(per-reader bandwidth × readers, ceiling) × the tail measured at the
      step that bandwidth comes from (the ceiling's step when the ceiling binds, else the largest);
    - fixed = one reader's start alone — each rank starts on its own node — + joining the rank
      group + reading the index, each measured;
    - ``storage_bps``: the storage's aggregate bandwidth as given ("what if our file system does
      1.5 TB/s"), in place of the measured ceiling.

    Defaults: the burst's own checkpoint and largest step. Every extrapolation is a warning
    naming its factor."""
    if not result.steps:
        raise ValueError("a burst with no steps")
    top = max(result.steps, key=lambda s: s.readers)
    single = min(result.steps, key=lambda s: s.readers)
    busy = [r for r in single.per_reader if r.bytes > 0] or single.per_reader
    per_reader = (
        min(r.bandwidth or 0.0 for r in busy) if single.readers == 1 else (single.aggregate_bps or 0.0) / len(busy)
    )
    job_bytes = job_bytes or result.bytes
    job_readers = job_readers or top.readers
    cap, capped_by = _cap(result, storage_bps)
    bandwidth = min(per_reader * job_readers, cap)
    at = result.ceiling[1]
    binds = storage_bps is None and at is not None and bandwidth == cap
    step = next(s for s in result.steps if s.readers == at) if binds else top
    fixed = single.startup_seconds + (result.rendezvous_seconds or 0.0) + (result.index_seconds or 0.0)
    read = job_bytes / bandwidth * step.tail if bandwidth > 0 else float("inf")
    g = 1e9
    why = [
        _fixed_line(result, single, fixed),
        f"per-reader bandwidth {per_reader / g:.3f} GB/s (measured at {single.readers} reader(s)); cap: {capped_by}",
        f"aggregate for {job_readers:,} readers: min({per_reader / g:.3f} × {job_readers:,}, "
        f"{'∞' if cap == float('inf') else f'{cap / g:,.3f}'}) = {bandwidth / g:,.3f} GB/s",
        f"read: {job_bytes / g:,.3f} GB / {bandwidth / g:,.3f} GB/s × tail {step.tail:.2f} (slowest busy reader / mean, "
        f"at {step.readers} readers: the step that bandwidth comes from) = {read:,.1f} s",
        f"R = {fixed:.2f} + {read:,.1f} = {fixed + read:,.1f} s",
    ]
    warnings = _warnings(result, top, job_bytes, job_readers, at, storage_bps)
    return RestartEstimate(fixed + read, fixed, read, step.tail, bandwidth, why, warnings)


def _cap(result: BurstResult, storage_bps: float | None) -> tuple[float, str]:
    """What bounds the job's aggregate: the storage's bandwidth given, the ceiling reached, or nothing known."""
    best, at = result.ceiling
    if storage_bps is not None:
        return storage_bps, f"the storage's {storage_bps / 1e9:,.3f} GB/s (given)"
    if at is not None and best:
        return best, f"the ceiling {best / 1e9:.3f} GB/s (reached at {at} readers)"
    return float("inf"), "no ceiling (none reached)"


def _fixed_line(result: BurstResult, single: Step, fixed: float) -> str:
    joining = result.rendezvous_seconds
    return (
        f"fixed: {single.startup_seconds:.2f} s to start one reader alone (interpreter, imports, storage), as each rank "
        "starts on its own node"
        + (f" + {joining:.2f} s to join the rank group" if joining is not None else "")
        + f" + {(result.index_seconds or 0.0):.3f} s to read the index = {fixed:.2f} s"
    )


def _warnings(
    result: BurstResult, top: Step, job_bytes: int, job_readers: int, at: int | None, storage_bps: float | None
) -> list[str]:
    """Each extrapolation of an estimate, named with its factor."""
    out = []
    if job_bytes > 10 * result.bytes:
        out.append(f"extrapolates {job_bytes / result.bytes:,.0f}× the {result.bytes:,} bytes measured")
    if job_readers > 10 * top.readers:
        out.append(
            f"extrapolates {job_readers / top.readers:,.0f}× the {top.readers} readers measured: a ceiling may lie between"
        )
    idle = [s for s in result.steps if s.idle]
    if idle:
        out.append(
            f"{idle[0].readers} readers for {result.files} file(s): {idle[0].idle} sat idle (not counted in the tail); "
            "a burst measures readers up to the file count"
        )
    if not result.cold:
        out.append("measured warm (from the page cache): a restart reads cold")
    if storage_bps is None and at is None and job_readers > top.readers:
        out.append(
            f"no ceiling within the {top.readers} readers measured: the storage's limit is unknown, so R is a lower bound "
            "(give the storage's bandwidth to bound it)"
        )
    if result.rendezvous_seconds is None and job_readers > 1:
        out.append(
            "the fixed cost holds no rank-group join (a burst run as the ranks of a job measures it): "
            f"{job_readers:,} ranks joining add to R"
        )
    if storage_bps is None and at is not None and result.rendezvous_seconds is None:
        out.append(
            "measured on one host: the ceiling may be this host's (its NIC or disk) — run the burst as ranks on several "
            "nodes to find the storage's, or give the storage's bandwidth"
        )
    return out


__all__ = ["BurstResult", "ReaderFigures", "RestartEstimate", "Step", "burst", "restart_estimate", "run_step"]
