"""``drill report``, ``drill metrics``, ``drill goodput``: what the record proves, and costs."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Annotated

import typer

from drill.cli.common import (
    SINCE_HELP,
    DbOption,
    DebugOption,
    JsonOption,
    StorageGbps,
    flag,
    print_json,
    since_flag,
    stderr,
    stdout,
    storage_bps,
    timeout_flag,
    write_output,
)
from drill.errors import UsageError

if TYPE_CHECKING:
    from drill.goodput import GoodputRow, MeasuredRestart

Since = Annotated[str, typer.Option("--since", help=SINCE_HELP)]
Until = Annotated[
    str | None,
    typer.Option(
        "--until",
        help="End of the window (exclusive; a date means the end of that day), as --since takes it. Default: now.",
    ),
]
GpusOption = Annotated[
    list[int] | None, typer.Option("--gpus", help="Job size in GPUs (repeatable). Default: 4096, 16384, 65536.")
]
PriceOption = Annotated[
    float | None,
    typer.Option(
        "--price-per-gpu-hour",
        help="Prices each part: the blocking saves' stall, rework, restarts, and their total, per day and per year.",
    ),
]
NoListOption = Annotated[
    bool, typer.Option("--no-list", help="Do not list run roots on storage: take retained checkpoints from the record.")
]
ListTimeout = Annotated[
    float,
    typer.Option(
        "--timeout",
        help="Seconds each run's storage listing may take before the report falls back to the record for it.",
    ),
]
BlockingS = Annotated[
    list[float] | None,
    typer.Option("--blocking-s", help="Blocking checkpoint time C, seconds (repeatable). Default 60."),
]
RestartS = Annotated[
    list[float] | None,
    typer.Option("--restart-s", help="Restart time R, seconds (repeatable). Default 600, or measured with --policy."),
]
MtbfHours = Annotated[
    float | None, typer.Option("--mtbf-hours", help="Job MTBF. Default: Llama 3 405B's rate scaled as 1/N.")
]
IntervalS = Annotated[
    float | None, typer.Option("--interval-s", help="A fixed checkpoint interval instead of the optimum.")
]
RFromPolicy = Annotated[
    str | None, typer.Option("--policy", help="Take R from this policy's drills: p95 time to first step.")
]
RFromBurst = Annotated[
    str | None,
    typer.Option(
        "--root", help="Take R from this run's latest drill burst (drill burst), for each --gpus as that many readers."
    ),
]
CheckpointBytes = Annotated[
    str | None,
    typer.Option("--checkpoint-bytes", help="With --policy: full checkpoint size (e.g. 2TB) to scale the restore to."),
]
RestoreBandwidth = Annotated[
    str | None,
    typer.Option("--restore-bandwidth", help="With --checkpoint-bytes: aggregate restore bandwidth, e.g. 200GB/s."),
]
SUFFIXES = {".html": "html", ".htm": "html", ".md": "md", ".markdown": "md", ".json": "json", ".csv": "csv"}


def _window(since: str, until: str | None) -> tuple[datetime | None, datetime | None]:
    """The report's period: ``--since`` (or ``all``) and ``--until``, each a date, a time or a duration."""
    from drill.units import parse_instant

    now = datetime.now(timezone.utc)
    start = since_flag(since)
    end = None if until is None else flag("--until", lambda v: parse_instant(v, now=now, end=True), until)
    if start is not None and end is not None and end <= start:
        raise UsageError(f"--until {until} is not after --since {since}: the window is empty")
    return start, end


def _format(fmt: str | None, output: str | None) -> str:
    from drill.report import FORMATS

    if fmt is None:
        fmt = SUFFIXES.get(os.path.splitext(output or "")[1].lower(), "md")
    if fmt not in FORMATS:
        raise UsageError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    return fmt


def report(
    since: Since = "30d",
    until: Until = None,
    policy: Annotated[str | None, typer.Option("--policy", help="Only this policy's drills.")] = None,
    root: Annotated[str | None, typer.Option("--root", help="Only this run directory.")] = None,
    fmt: Annotated[
        str | None, typer.Option("--format", "-f", help="html, md, json or csv (default: from -o's suffix, else md).")
    ] = None,
    output: Annotated[
        str | None, typer.Option("--output", "-o", help="Write the report here (atomically) instead of stdout.")
    ] = None,
    gpus: GpusOption = None,
    blocking_s: Annotated[
        float, typer.Option("--blocking-s", help="Blocking checkpoint time C for the goodput section.")
    ] = 60.0,
    price: PriceOption = None,
    no_list: NoListOption = False,
    timeout: ListTimeout = 60.0,
    drills: Annotated[
        str | None,
        typer.Option(
            "--drills",
            help="Drills each run lists in full: the newest N and the failures among the newest 2N (counts and percentiles cover all), or 'all'. Default: 200.",
        ),
    ] = None,
    db: DbOption = None,
    debug: DebugOption = False,
) -> None:
    """Write an audit report: which checkpoints are proven restorable, on what evidence.

    Per run: the retained checkpoints and their last verdicts, every drill with its evidence,
    coverage, latency trends (p50/p95), SLO breaches, failures with the command to re-run
    them, what the measured restore time costs, and the audit chain's head to pin.

    Example: drill report --since 2026-11-01 --until 2026-11-30 -f html -o november.html
    """
    from drill.report import ReportOptions, build_report, render
    from drill.report.build import DEFAULT_GPUS, DEFAULT_LISTED

    kind = _format(fmt, output)
    start, end = _window(since, until)
    timeout_flag(timeout)
    options = ReportOptions(
        since=start, until=end, policy=policy, root=root, gpus=tuple(gpus or DEFAULT_GPUS), blocking_s=blocking_s, price_per_gpu_hour=price,
        list_storage=not no_list, listing_timeout=timeout, listed=DEFAULT_LISTED if drills is None else _listed(drills),
    )  # fmt: skip
    _check_goodput_inputs(options.gpus, [blocking_s], price)
    doc = build_report(db, options)
    text = render(doc, kind)
    if output is None:
        typer.echo(text, nl=False)
        return
    write_output(output, text)
    stderr().print(f"wrote {output}: {kind}, {doc.drills} drill(s) in {len(doc.runs)} run(s)", markup=False)


def _listed(value: str) -> int | None:
    if value.strip().lower() == "all":
        return None
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise UsageError(f"--drills: {value!r} is neither a number of drills nor 'all'")
    return n


def _check_goodput_inputs(gpus: Sequence[int], blocking: list[float], price: float | None) -> None:
    from drill.goodput import GoodputError, goodput

    try:
        for n in gpus:
            for c in blocking:
                goodput(gpus=n, blocking_s=c, restart_s=0, price_per_gpu_hour=price)
    except GoodputError as exc:
        raise UsageError(str(exc)) from None


def metrics(
    textfile: Annotated[
        str, typer.Option("--textfile", help="The .prom file node_exporter's textfile collector reads.")
    ],
    coverage_days: Annotated[float, typer.Option("--coverage-days", help="Window for the coverage gauges.")] = 7.0,
    no_list: NoListOption = False,
    db: DbOption = None,
    debug: DebugOption = False,
) -> None:
    """Write Prometheus gauges for node_exporter's textfile collector, atomically.

    Last verdict per policy and run, restore latency, time to first step, bytes verified,
    coverage, age of the last passing drill, and whether the audit chain is intact.

    Example: drill metrics --textfile /var/lib/node_exporter/textfile/drill.prom
    """
    from drill.metrics import write_textfile

    directory = os.path.dirname(os.path.abspath(textfile))
    if not os.path.isdir(directory):
        raise UsageError(f"--textfile: directory {directory} does not exist")
    if coverage_days <= 0:
        raise UsageError(f"--coverage-days must be positive, not {coverage_days:g}")
    try:
        series = write_textfile(textfile, db, coverage_days=coverage_days, list_storage=not no_list)
    except OSError as exc:
        raise UsageError(f"--textfile: cannot write {textfile} ({exc.strerror or exc})") from None
    note = "" if textfile.endswith(".prom") else " (node_exporter reads only *.prom files)"
    stderr().print(f"wrote {series} series to {textfile}{note}", markup=False)


def _measured_r(
    policy: str,
    since: str,
    checkpoint_bytes: str | None,
    restore_bandwidth: str | None,
    db: str | None,
    gpus: list[int] | None,
) -> MeasuredRestart:
    """R measured from a policy's drills, warning where it extrapolates to the job's size."""
    measured, read = _measured(policy, _window(since, None)[0], checkpoint_bytes, restore_bandwidth, db)
    for w in _extrapolation(read, checkpoint_bytes, gpus or [4096, 16384, 65536]):
        stderr().print(f"drill: warning: {w}", markup=False)
    return measured


def _render_goodput_table(
    rows: list[GoodputRow], measured: MeasuredRestart | None, policy: str | None, *, priced: bool, json: bool
) -> None:
    if json:
        print_json(
            {
                "rows": [r.to_dict() for r in rows],
                "restart": None
                if measured is None
                else {"restart_s": measured.restart_s, "drills": measured.drills, "how": measured.how},
            }
        )
        return None
    from drill.cli.render import render_goodput

    render_goodput(stdout(), rows, priced=priced)
    if measured is not None:  # the explanation of R belongs with the table it decides
        stdout().print(f"R = {measured.restart_s:.1f} s: {measured.how} of policy {policy}", markup=False)


def goodput(
    gpus: GpusOption = None,
    blocking_s: BlockingS = None,
    restart_s: RestartS = None,
    mtbf_hours: MtbfHours = None,
    interval_s: IntervalS = None,
    price: PriceOption = None,
    policy: RFromPolicy = None,
    root: RFromBurst = None,
    since: Since = "30d",
    checkpoint_bytes: CheckpointBytes = None,
    restore_bandwidth: RestoreBandwidth = None,
    storage_gbps: StorageGbps = None,
    db: DbOption = None,
    json: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """Young/Daly goodput: what checkpointing and restarts cost a run of N GPUs.

    τ* = √(2·C·M); waste = C/τ + (τ/2 + R)/M for blocking checkpoint time C, MTBF M and
    restart time R. Inputs repeat to make a table.

    Example: drill goodput --gpus 4096 --gpus 16384 --gpus 65536 --blocking-s 30 --restart-s 600 --price-per-gpu-hour 2.5
    """
    from drill.goodput import GoodputError, table

    measured = None
    storage = storage_bps(storage_gbps)
    if storage is not None and root is None:
        raise UsageError("--storage-gbps caps R from a burst: add --root (with --policy, give --restore-bandwidth)")
    if root is not None:
        if policy or restart_s or restore_bandwidth:
            raise UsageError(
                "--root takes R from the run's latest burst: drop --policy, --restart-s and --restore-bandwidth"
            )
        return _goodput_from_burst(
            root,
            gpus or [4096, 16384, 65536],
            blocking_s or [60.0],
            mtbf_hours,
            interval_s,
            price,
            checkpoint_bytes,
            db,
            json,
            storage,
        )
    if policy is not None:
        if restart_s:
            raise UsageError("--restart-s and --policy both set R: give one")
        measured = _measured_r(policy, since, checkpoint_bytes, restore_bandwidth, db, gpus)
        restart_s = [measured.restart_s]
    elif checkpoint_bytes or restore_bandwidth:
        raise UsageError("--checkpoint-bytes and --restore-bandwidth scale a policy's measured restore: add --policy")
    try:
        rows = table(
            gpus=gpus or [4096, 16384, 65536],
            blocking_s=blocking_s or [60.0],
            restart_s=restart_s or [600.0],
            mtbf_hours=mtbf_hours,
            interval_s=interval_s,
            price_per_gpu_hour=price,
        )
    except GoodputError as exc:
        raise UsageError(str(exc)) from None
    _render_goodput_table(rows, measured, policy, priced=price is not None, json=json)


def _goodput_from_burst(root: str, gpus: list[int], blocking: list[float], mtbf: float | None, interval: float | None, price: float | None,
                        checkpoint_bytes: str | None, db: str | None, json: bool, storage: float | None = None) -> None:  # fmt: skip
    """R per GPU count from the run's latest burst: every GPU's rank reads its share at once."""
    from drill.api import bursts
    from drill.burst import BurstResult, restart_estimate
    from drill.cli.render import render_goodput
    from drill.goodput import GoodputError, table
    from drill.units import parse_size

    found = bursts(db=db, root=root, limit=1)
    if not found:
        raise UsageError(f"--root {root}: no drill burst of this run is recorded (run drill burst --root {root} first)")
    doc = found[0]
    result = BurstResult.from_dict(doc)
    size = flag("--checkpoint-bytes", parse_size, checkpoint_bytes) if checkpoint_bytes else None
    rows, estimates = [], []
    try:
        for n in gpus:
            est = restart_estimate(result, job_bytes=size, job_readers=n, storage_bps=storage)
            estimates.append((n, est))
            rows += table(
                gpus=[n],
                blocking_s=blocking,
                restart_s=[est.restart_s],
                mtbf_hours=mtbf,
                interval_s=interval,
                price_per_gpu_hour=price,
            )
    except (GoodputError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    source = f"burst #{doc['id']} of {doc['checkpoint']} on {doc['host']} at {doc['started_at']} ({'cold' if doc['cold'] else 'warm'})"
    if json:
        print_json(
            {
                "rows": [r.to_dict() for r in rows],
                "restart": {"source": source, "per_gpus": {str(n): e.to_dict() for n, e in estimates}},
            }
        )
        return
    render_goodput(stdout(), rows, priced=price is not None)
    out = stdout()
    out.print(f"R from {source}:", markup=False)
    for n, est in estimates:
        out.print(f"  {n:,} GPUs: R = {est.restart_s:,.1f} s", markup=False)
        for line in est.explanation:
            out.print(f"    {line}", markup=False)
    for w in sorted({w for _, est in estimates for w in est.warnings}):
        stderr().print(f"drill: warning: {w}", markup=False)


def _measured(
    policy: str, since: datetime | None, checkpoint_bytes: str | None, bandwidth: str | None, db: str | None
) -> tuple[MeasuredRestart, int]:
    """R from the policy's drills (cold ones when there are any), and the bytes a drill read (median)."""
    from drill.api import history
    from drill.goodput import GoodputError, measured_restart
    from drill.units import parse_size

    size = flag("--checkpoint-bytes", parse_size, checkpoint_bytes) if checkpoint_bytes else None
    rate = flag("--restore-bandwidth", parse_size, bandwidth.removesuffix("/s")) if bandwidth else None
    drills = [d for d in history(db=db, policy=policy, since=since, limit=100_000) if d.timings.ttfs is not None]
    if not drills:
        raise UsageError(
            f"--policy {policy}: no drill of it has a time to first step in the window (run one with its replay enabled)"
        )
    cold = [d for d in drills if d.page_cache and d.page_cache.get("cold")]
    samples = [(d.timings.ttfs, d.timings.restore) for d in cold or drills]
    try:
        measured = measured_restart(samples, checkpoint_bytes=size, bandwidth=rate)  # type: ignore[arg-type]
    except GoodputError as exc:
        raise UsageError(str(exc)) from None
    used = cold or drills
    read = sorted(d.bytes_read or 0 for d in used)[len(used) // 2]
    if cold:
        return dataclasses.replace(
            measured,
            how=f"{measured.how}, from its {len(cold)} cold drill(s) (page cache dropped first, as a restart reads)",
        ), read
    return dataclasses.replace(
        measured,
        how=f"{measured.how} — warm: these drills read from the page cache, a restart reads cold; run cold ones (drill run --cold, checkpoints.cold: true)",
    ), read


def _extrapolation(read: int, checkpoint_bytes: str | None, gpus: list[int]) -> list[str]:
    """What R from a policy's drills is being stretched to: more than 10× the bytes one drill
    read, or GPU counts no single-process drill can speak for."""
    from drill.units import human_bytes, parse_size

    out = []
    target = parse_size(checkpoint_bytes) if checkpoint_bytes else None
    if target is not None and read and target > 10 * read:
        out.append(f"R extrapolates {target / read:,.0f}× the {human_bytes(read)} these drills read")
    if target is None and max(gpus) > 1:
        out.append(f"R is what a drill of a {human_bytes(read)} checkpoint took in one process, applied to {max(gpus):,} GPUs as it is: "
                   "give --checkpoint-bytes, or measure a restore burst (drill burst; drill goodput --root)")  # fmt: skip
    return out
