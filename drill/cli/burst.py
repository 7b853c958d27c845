"""``drill burst``: what a restart of the whole job costs — readers restoring one checkpoint at once."""

from __future__ import annotations

from typing import Annotated

import typer

from drill.cli.common import (
    CheckpointOption,
    DbOption,
    DebugOption,
    JsonOption,
    RunRootOption,
    StorageGbps,
    print_json,
    stderr,
    stdout,
    storage_bps,
    timeout_flag,
)
from drill.errors import UsageError

Readers = Annotated[
    str,
    typer.Option(
        "--readers",
        help="Reader counts to sweep, comma-separated (default: 1,2,4 and on, doubling, to twice the cores).",
    ),
]
Warm = Annotated[
    bool,
    typer.Option(
        "--warm", help="Read from the page cache as it is (default: drop the checkpoint first, a restart's cold read)."
    ),
]
Replicated = Annotated[
    bool, typer.Option("--replicated", help="Every reader reads every file (replicated state), not its share.")
]
JobBytes = Annotated[
    str | None,
    typer.Option(
        "--job-bytes", help="R for a job whose checkpoint is this big (e.g. 5.7TB); default: this checkpoint."
    ),
]
JobReaders = Annotated[
    int | None,
    typer.Option("--job-readers", help="R for a job of this many reading ranks; default: the sweep's largest."),
]


def burst(
    root: RunRootOption,
    checkpoint: CheckpointOption = "latest",
    readers: Readers = "",
    warm: Warm = False,
    replicated: Replicated = False,
    job_bytes: JobBytes = None,
    job_readers: JobReaders = None,
    storage_gbps: StorageGbps = None,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            help="Seconds the whole burst may take before it ends as an error (storage that never answers).",
        ),
    ] = 3600.0,
    db: DbOption = None,
    json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Measure a restore burst: N readers restoring one checkpoint at the same moment, swept.

    For each reader count, that many processes on this host are released together from one
    barrier, each reading and hashing its share of the checkpoint's files (dropped from the
    page cache first, unless --warm). Prints per step the aggregate bandwidth, the slowest
    reader, the tail and time to first byte; the ceiling (where more readers stop adding
    bandwidth); and R for the job (fixed costs + bytes / min(per-reader × readers, ceiling) ×
    tail), with its arithmetic. Recorded; drill goodput --root takes R from it. Under
    torchrun, srun or an indexed Job the readers are the job's ranks, on their own nodes.

    Example: drill burst --root /lustre/runs/llama --readers 1,2,4,8,16 --job-bytes 5.7TB --job-readers 16384
    """
    from drill.burst import restart_estimate
    from drill.dist.context import launched_world
    from drill.storage import normalize
    from drill.units import parse_size

    world = launched_world()
    counts = _counts(readers, world[1] if world else None)
    size = _size(job_bytes, parse_size)
    if job_readers is not None and job_readers < 1:
        raise UsageError(f"--job-readers must be at least 1, not {job_readers}")
    storage = storage_bps(storage_gbps)
    from drill.interrupts import deadline

    with deadline(timeout_flag(timeout), f"drill burst of {root}"):  # its readers are stopped with it
        uri = _checkpoint(root, checkpoint)
        result = _sweep(uri, counts, cold=not warm, replicated=replicated, as_ranks=world is not None)
    if result is None:  # a rank other than 0: it read its share; rank 0 records and reports
        return None
    estimate = restart_estimate(result, job_bytes=size, job_readers=job_readers, storage_bps=storage)
    document = {**result.to_dict(), "restart": estimate.to_dict()}
    burst_id = _record(normalize(root), document, db)
    if json:
        return print_json({"id": burst_id, **document})
    from drill.cli.render import render_burst

    render_burst(stdout(), {"id": burst_id, **document})
    for w in estimate.warnings:
        stderr().print(f"drill: warning: {w}", markup=False)
    return None


def _checkpoint(root: str, checkpoint: str) -> str:
    """The checkpoint ``--checkpoint`` names under ``--root`` (as ``drill run`` chooses it)."""
    from drill.api import list_run
    from drill.select import parse_selector, select

    try:
        selector = parse_selector(checkpoint)
    except ValueError as exc:
        raise UsageError(f"--checkpoint: {exc}") from None
    return select(list_run(root)[1], selector).ref.uri


def _sweep(uri: str, counts: list[int], *, cold: bool, replicated: bool, as_ranks: bool):  # type: ignore[no-untyped-def]
    """The sweep, here or as the ranks of the job this process is one of (None on ranks but 0)."""
    from drill.burst import burst as run_burst
    from drill.dist.context import connect
    from drill.units import human_rate

    err = stderr()
    dist, joining = None, None
    if as_ranks:
        import time

        age = _process_age()
        started = time.perf_counter()
        dist = connect()
        joining = (age, time.perf_counter() - started)
    try:
        if dist is None or dist.is_root:
            err.print(
                f"drill: burst of {uri}: {', '.join(map(str, counts))} readers{' (ranks)' if dist else ''}, {'cold' if cold else 'warm'}",
                markup=False,
            )
        return run_burst(uri, readers=counts, cold=cold, replicated=replicated, dist=dist, joining=joining,
                         on_step=lambda st: err.print(f"drill: {st.readers} reader(s): {human_rate(st.aggregate_bps)}", markup=False))  # fmt: skip
    finally:
        if dist is not None:
            dist.close()


def _process_age() -> float:
    """Seconds since this process started (its interpreter and imports, before it joins)."""
    with open("/proc/self/stat", encoding="ascii") as f:
        start_ticks = int(f.read().rpartition(")")[2].split()[19])
    with open("/proc/uptime", encoding="ascii") as f:
        uptime = float(f.read().split()[0])
    import os

    return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


def _counts(text: str, world: int | None = None) -> list[int]:
    """The sweep: as given, else 1, 2, 4, … up to twice the cores (or, as ranks, the world)."""
    if not text.strip():
        import os

        limit, out = world or max(4, 2 * (os.cpu_count() or 1)), [1]
        while out[-1] * 2 <= limit:
            out.append(out[-1] * 2)
        return out if out[-1] == limit or world is None else [*out, limit]
    try:
        counts = [int(v) for v in text.split(",")]  # an empty item ("1,,2") is no count
    except ValueError:
        raise UsageError(f"--readers {text!r}: give reader counts, comma-separated, e.g. 1,2,4,8") from None
    top = world or 4096
    if not counts or any(c < 1 or c > top for c in counts):
        raise UsageError(
            f"--readers {text!r}: each count must be between 1 and {top}" + (" (the job's ranks)" if world else "")
        )
    return sorted(set(counts))


def _size(text: str | None, parse) -> int | None:  # type: ignore[no-untyped-def]
    if text is None:
        return None
    try:
        return int(parse(text))
    except ValueError as exc:
        raise UsageError(f"--job-bytes {text!r}: {exc}") from None


def _record(run_root: str, document: dict, db: str | None) -> int | None:
    from drill.errors import DrillError
    from drill.records.db import open_database
    from drill.records.store import Records

    try:
        database = open_database(db)
        try:
            return Records(database).record_burst(run_root, document)
        finally:
            database.close()
    except DrillError as exc:
        stderr().print(f"drill: warning: the burst could not be recorded ({exc.message})", markup=False)
        return None
