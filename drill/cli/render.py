"""Rendering drill results for people: library objects in, rich text on stdout.

Nothing from a checkpoint is ever interpreted as markup: check summaries, findings, paths and
keys are printed with ``markup=False`` or escaped. A check and its findings are lines of
plain text with styles, no markup: where nothing is styled (a pipe, a file) they are printed
without loading rich (:class:`~drill.cli.common.Out`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from drill.claims import proof_of
from drill.findings import CheckResult, CheckStatus, Finding, Severity
from drill.units import human_bytes, human_rate, human_seconds
from drill.verdict import DrillStatus

if TYPE_CHECKING:  # drill verify renders checks without importing torch, nor rich
    from rich.table import Table

    from drill.cli.common import Out
    from drill.pipeline.outcome import DrillOutcome

STATUS_STYLE = {
    DrillStatus.PASSED: "bold green",
    DrillStatus.SLO_BREACH: "bold yellow",
    DrillStatus.FAILED: "bold red",
    DrillStatus.ERROR: "bold magenta",
    DrillStatus.ABORTED: "bold yellow",
    DrillStatus.RUNNING: "cyan",
    CheckStatus.SKIPPED: "dim",
    CheckStatus.ERROR: "bold magenta",
}
EVIDENCE_SHOWN = 12
"""Evidence entries shown per check by ``drill show`` (``--json`` has all of them)."""


def _table(**kw: Any) -> Table:
    """A borderless table. rich.table (5 ms of imports) loads with the first one: ``drill
    verify`` prints none."""
    from rich.table import Table

    return Table(box=None, pad_edge=False, **kw)


def escape(text: str) -> str:
    """``text`` shown as it is inside markup (rich's escape, loaded with the first table)."""
    from rich.markup import escape

    return escape(text)


def _style(status: str) -> str:
    return next((v for k, v in STATUS_STYLE.items() if k == status), "")


def _styled(status: str) -> str:
    return f"[{_style(status)}]{status.upper()}[/]"


def render_findings(console: Out, findings: list[Finding]) -> None:
    for f in findings:
        if f.severity is Severity.INFO:
            continue
        colour = "red" if f.severity is Severity.ERROR else "yellow"
        where = f" [{f.subject}]" if f.subject else ""
        console.print(f.severity.value, end="", markup=False, style=colour)
        console.print(f" {f.code}{where}: {f.message}", markup=False)
        if f.hint:
            console.print(f"  hint: {f.hint}", markup=False, style="dim")


def render_check(console: Out, check: CheckResult) -> None:
    console.print(check.name, end=" ", markup=False, style="bold")
    console.print(check.status.value.upper(), end="  ", markup=False, style=_style(check.status.value))
    console.print(check.summary, markup=False)
    render_findings(console, check.findings)


def _latency(o: DrillOutcome) -> str:
    t = o.timings
    parts = [
        f"discover {human_seconds(t.discover)}",
        f"plan {human_seconds(t.plan)}",
        f"read {human_seconds(t.read)}",
        f"load {human_seconds(t.load)}",
    ]
    parts.append(f"other {human_seconds(t.other)}")
    return f"restore {human_seconds(t.restore)} = " + " + ".join(parts)


def _job(o: DrillOutcome) -> str:
    """``slurm:12#ab (attempt 2: the job was restarted; earlier: drill #7)``."""
    earlier = (o.options or {}).get("earlier_attempts")
    if not earlier:
        return str(o.job_id)
    shown = ", ".join(f"#{i}" for i in earlier)
    return f"{o.job_id} (attempt {len(earlier) + 1}: the job was restarted; earlier: drill {shown})"


def render_outcome(console: Out, o: DrillOutcome, where: str | None = None) -> None:
    """What ``drill run`` prints: every check with its evidence line, findings, the verdict."""
    table = _table(show_header=True, header_style="bold")
    for col in ("check", "status", "evidence"):
        table.add_column(col)
    for c in o.checks:
        table.add_row(escape(c.name), _styled(c.status.value), escape(c.summary))
    console.print(table)
    if any(f.severity is not Severity.INFO for f in o.findings):
        console.print()
    render_findings(console, o.findings)
    console.print()
    ck = o.checkpoint
    target = f"{ck.name} (step {ck.step})" if ck and ck.step is not None else (ck.name if ck else "no checkpoint")
    drill_no = f"drill #{o.id}" if o.id is not None else "drill (not recorded)"
    console.print(f"{_styled(o.status.value)}  {drill_no}  {escape(target)}  on {escape(o.device)}")
    if o.timings.restore is not None:
        console.print(f"{_latency(o)}; checks {human_seconds(o.timings.checks)}", markup=False)
        console.print(f"read {human_bytes(o.bytes_read)} at {human_rate(o.throughput_bps)}", markup=False)
    if o.timings.ttfs is not None:
        console.print(
            f"time to first step {human_seconds(o.timings.ttfs)} (drill start → first replayed step done)", markup=False
        )
    if o.distributed:
        render_ranks(console, o.distributed)
    if o.job_id:
        console.print(f"batch job {_job(o)}", markup=False)
    if o.id is not None:
        console.print(f"recorded in {where or 'the record database'}  (drill show {o.id})", markup=False, style="dim")
    if o.status is DrillStatus.FAILED and ck is not None:
        console.print(f"re-check the bytes without restoring: drill verify {ck.uri}", markup=False, style="dim")


def render_ranks(console: Out, dist: dict) -> None:
    """A distributed drill's ranks: who read what, how fast; the balance and the slowest."""
    balance = dist.get("balance")
    slowest = dist.get("slowest") or {}
    console.print(
        f"{dist['world_size']} ranks, byte balance {balance:.2f} (max/min)"
        if balance
        else f"{dist['world_size']} ranks (a rank read nothing)",
        markup=False,
    )
    for r in dist.get("ranks", []):
        console.print(
            f"  rank {r['rank']} on {r['host']}: {r['files']} file(s), {human_bytes(r['bytes'])} in {human_seconds(r['seconds'])} ({human_rate(r.get('throughput_bps'))})",
            markup=False,
        )
    if slowest:
        console.print(
            f"  slowest: rank {slowest['rank']}, {human_seconds(slowest['seconds'])}: {slowest['why']}", markup=False
        )


HISTORY_COLUMNS = (
    "id",
    "started (UTC)",
    "status",
    "checkpoint",
    "evidence",
    "replay",
    "restore",
    "first step",
    "read",
    "rate",
    "trigger",
)
HISTORY_NARROW = ("id", "started (UTC)", "status", "checkpoint", "evidence", "replay", "restore")
"""What fits 80 columns: the rest (first step, bytes, rate, trigger) on a wider terminal and in --json."""


def render_history(console: Out, drills: list[DrillOutcome]) -> None:
    columns = HISTORY_COLUMNS if console.width >= 120 else HISTORY_NARROW
    table = _table(header_style="bold")
    right = ("id", "restore", "first step", "read", "rate")
    for col in columns:
        table.add_column(
            col, justify="right" if col in right else "left", overflow="fold" if col == "checkpoint" else "ellipsis"
        )
    for d in drills:
        proof = proof_of(d)
        cells = {
            "id": str(d.id),
            "started (UTC)": d.started_at.isoformat()[:16].replace("T", " "),
            "status": _styled(d.status.value)
            + (" [bold red](record fails its seal)[/]" if proof.record == "broken" else ""),
            "checkpoint": escape(
                d.checkpoint.name
                if d.checkpoint and console.width < 120
                else (d.checkpoint.uri if d.checkpoint else d.run_root)
            ),
            "evidence": escape(
                proof.evidence if proof.sample in (None, "all") else f"{proof.evidence} ({proof.sample})"
            ),
            "replay": escape(proof.replay),
            "restore": human_seconds(d.timings.restore),
            "first step": human_seconds(d.timings.ttfs),
            "read": human_bytes(d.bytes_read),
            "rate": human_rate(d.throughput_bps),
            "trigger": escape(d.trigger + (f" ({d.policy})" if d.policy else "")),
        }
        table.add_row(*(cells[c] for c in columns))
    console.print(table)


def describe_cache(cache: dict[str, Any] | None) -> str:
    """``cold: 0 B of 1.1 GB cached after the drop (…)``, ``warm: 100% of 1.1 GB cached (…)``."""
    if not cache:
        return "-"
    kind = "cold" if cache.get("cold") else "warm"
    if "error" in cache:
        return f"{kind} asked; the cache could not be read: {cache['error']}"
    if cache.get("resident") is None:
        return f"{kind}: {cache.get('how')}"
    total, resident = cache.get("bytes") or 0, cache["resident"]
    share = f"{100 * resident / total:.0f}%" if total else "0%"
    when = "after the drop" if cache.get("cold") else "when the restore began"
    return f"{kind}: {human_bytes(resident)} ({share}) of {human_bytes(total)} cached {when} ({cache.get('how')})"


def render_burst(console: Out, doc: dict[str, Any]) -> None:
    """A burst's document (``drill burst``, ``drill show --burst``): the sweep, the ceiling, R."""
    head = f"burst #{doc.get('id') if doc.get('id') is not None else '-'} of {doc['checkpoint']}: {human_bytes(doc['bytes'])} in {doc['files']} files, "
    extra = f" on {doc['host']} at {doc['started_at']}" if doc.get("host") else ""
    console.print(
        head + ("cold" if doc["cold"] else "warm") + (", replicated" if doc["replicated"] else "") + extra, markup=False
    )
    table = _table(header_style="bold")
    for col in ("readers", "aggregate", "per reader", "slowest", "tail", "first byte", "start-up"):
        table.add_column(col, justify="right")
    for st in doc["steps"]:
        agg = st["aggregate_bps"]
        table.add_row(str(st["readers"]), human_rate(agg), human_rate((agg or 0) / st["readers"]), human_seconds(st["slowest_seconds"]), f"{st['tail']:.2f}",
                      human_seconds(st["ttfb_seconds"]) if st["ttfb_seconds"] is not None else "-", human_seconds(st["startup_seconds"]))  # fmt: skip
    console.print(table)
    last = doc["steps"][-1]["readers"] if doc["steps"] else 0
    console.print(
        f"ceiling: {human_rate(doc['ceiling_bps'])} at {doc['ceiling_readers']} readers"
        if doc["ceiling_readers"]
        else f"no ceiling within {last} readers (best {human_rate(doc['ceiling_bps'])})",
        markup=False,
    )
    restart = doc.get("restart")
    if restart:
        console.print(f"R = {restart['restart_s']:,.1f} s", markup=False)
        for line in restart["explanation"]:
            console.print(f"  {line}", markup=False)
        for w in restart["warnings"]:
            console.print(f"  warning: {w}", markup=False, style="yellow")


def render_bursts(console: Out, docs: list[dict[str, Any]]) -> None:
    """``drill history --bursts``: one line per recorded burst, newest first."""
    table = _table(header_style="bold")
    for col in ("burst", "started", "checkpoint", "read", "readers", "ceiling", "R"):
        table.add_column(col)
    for d in docs:
        readers = ",".join(str(st["readers"]) for st in d["steps"])
        ceiling = (
            f"{human_rate(d['ceiling_bps'])} at {d['ceiling_readers']}"
            if d["ceiling_readers"]
            else f"none ({human_rate(d['ceiling_bps'])} best)"
        )
        r = (d.get("restart") or {}).get("restart_s")
        table.add_row(f"#{d['id']}", d["started_at"][:16].replace("T", " "), escape(d["checkpoint"]), "cold" if d["cold"] else "warm", readers, ceiling,
                      f"{r:,.1f} s" if r is not None else "-")  # fmt: skip
    console.print(table)


def render_drill(console: Out, o: DrillOutcome) -> None:
    """What ``drill show`` prints: the record in full — evidence, replay steps, alerts."""
    ck = o.checkpoint
    console.print(f"drill #{o.id}  {_styled(o.status.value)}  (exit code {int(o.exit_code)})")
    if o.seal is not None and o.seal.broken:
        console.print(f"[bold red]RECORD FAILS ITS AUDIT SEAL[/]: {escape(o.seal.message or '')} — evidence of nothing")
    rows = [
        (
            "checkpoint",
            f"{ck.uri} (step {ck.step}, {ck.format}, {human_bytes(ck.bytes)} in {ck.files} files)" if ck else "-",
        ),
        ("run root", o.run_root),
        ("trigger", o.trigger + (f" (policy {o.policy})" if o.policy else "")),
        ("selection", o.selection or o.selector),
        ("host / pid", f"{o.host} / {o.pid}"),
        ("device", o.device),
        ("started", o.started_at.isoformat()),
        ("finished", o.finished_at.isoformat() if o.finished_at else f"- (last phase: {o.phase})"),
        ("latency", _latency(o) if o.timings.restore is not None else "-"),
        ("checks / replay", f"{human_seconds(o.timings.checks)} / {human_seconds(o.timings.replay)}"),
        ("first step", f"{human_seconds(o.timings.ttfs)} (replay {o.replay.verdict if o.replay else 'not run'})"),
        ("read", f"{human_bytes(o.bytes_read)} at {human_rate(o.throughput_bps)}"),
        ("read from", describe_cache(o.page_cache)),
        ("proof", proof_of(o).describe()),
        ("SLO", _slo(o)),
        ("versions", ", ".join(f"{k} {v}" for k, v in o.versions.items())),
    ]
    if o.message:
        rows.insert(1, ("why", o.message))
    if o.job_id:
        rows.append(("batch job", _job(o)))
    table = _table(show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for k, v in rows:
        table.add_row(k, escape(str(v)))
    console.print(table)
    if o.distributed:
        console.print()
        render_ranks(console, o.distributed)
    for c in o.checks:
        console.print()
        render_check(console, c)
        _render_evidence(console, c.evidence)
    _render_replay_steps(console, o)
    _render_alerts(console, o.alerts)
    if o.error and o.error != o.message:
        console.print()
        console.print("error:", style="bold")
        for line in o.error.splitlines():  # a traceback, a line at a time: each line one line
            console.print(line, markup=False)


def _slo(o: DrillOutcome) -> str:
    """Each SLO target against what was measured; the breaches a drill recorded otherwise."""
    from drill.verdict import SLO

    targets = (o.options or {}).get("slo")
    if isinstance(targets, dict):
        return SLO(**{k: v for k, v in targets.items() if k in ("max_restore_seconds", "max_ttfs_seconds")}).describe(
            o.timings.restore, o.timings.ttfs
        )
    return "; ".join(str(b.get("message", b)) for b in o.slo_breaches.values()) or "no SLO recorded"


def _render_evidence(console: Out, evidence: dict[str, Any]) -> None:
    shown = [(k, v) for k, v in evidence.items() if k not in ("steps", "traceback")]
    for key, value in shown[:EVIDENCE_SHOWN]:
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        if len(text) > 160:
            text = text[:157] + "…"
        console.print(f"  {key}: {text}", markup=False, style="dim")
    if len(shown) > EVIDENCE_SHOWN:
        console.print(f"  … {len(shown) - EVIDENCE_SHOWN} more (drill show --json)", markup=False, style="dim")


def _render_replay_steps(console: Out, o: DrillOutcome) -> None:
    if o.replay is None or not o.replay.steps:
        return
    console.print()
    table = _table(title="replayed steps", header_style="bold", title_justify="left")
    for col in (
        "step",
        "loss (original)",
        "loss (replayed)",
        "grad norm (original)",
        "grad norm (replayed)",
        "batch",
        "match",
    ):
        table.add_column(col, justify="right" if col not in ("batch", "match") else "left")
    for r in o.replay.steps:
        same_batch = (
            "same"
            if r.get("reference_batch") and r.get("reference_batch") == r.get("batch")
            else (r.get("batch") or "-")
        )
        table.add_row(
            str(r["step"]),
            _num(r.get("reference_loss")),
            _num(r.get("loss")),
            _num(r.get("reference_grad_norm")),
            _num(r.get("grad_norm")),
            escape(str(same_batch)),
            "yes" if r.get("matches") else "NO",
        )
    console.print(table)


def _render_alerts(console: Out, alerts: list[dict[str, Any]]) -> None:
    if not alerts:
        return
    console.print()
    for a in alerts:
        state = "delivered" if a["delivered"] else f"NOT delivered ({a.get('error')})"
        console.print(f"alert {a['channel']} → {a['target']}: {state} after {a['attempts']} attempt(s)", markup=False)


def _num(value: Any) -> str:
    return "-" if value is None else (value if isinstance(value, str) else f"{value:.6g}")


def render_scheduler(console: Out, state: dict[str, Any]) -> None:
    sched = state["scheduler"]
    if state["alive"]:
        console.print(
            f"scheduler [bold green]ALIVE[/]  {escape(sched['host'])} pid {sched['pid']}, "
            f"heartbeat {sched['heartbeat_age_seconds']:.0f} s ago, since {sched['started_at'][:19]}"
        )
    elif sched:
        console.print(
            f"scheduler [bold red]NOT RUNNING[/]  last heartbeat {sched['heartbeat_at'][:19]} from {escape(sched['host'])} pid {sched['pid']}"
        )
    else:
        console.print("scheduler [bold red]NOT RUNNING[/]  (never started on this database)")
    table = _table(header_style="bold")
    for col in ("policy", "next fire (UTC)", "last drill", "verdict", "checkpoint", "history"):
        table.add_column(col)
    for name, p in state["policies"].items():
        last = p["last"]
        counts = ", ".join(f"{k} {v}" for k, v in sorted(p["counts"].items()))
        table.add_row(
            escape(name),
            (p["next_fire"] or "-")[:19].replace("T", " "),
            f"#{last['id']} {last['started_at'][:19].replace('T', ' ')}" if last else "-",
            _styled(last["status"]) if last else "-",
            escape((last["checkpoint"] or {}).get("uri", "-")) if last else "-",
            counts or "-",
        )
    console.print(table)


def render_goodput(console: Out, rows: list, *, priced: bool) -> None:
    """``drill goodput``'s table: one row per combination of GPUs, C and R; priced, each part of
    the waste apart — the blocking saves' stall, the rework, the restarts — and their total."""
    table = _table(header_style="bold")
    cols = ["GPUs", "MTBF", "C", "R", "interval", "saves/day", "waste", "restart share", "wasted GPU-h/day"]
    if priced:
        cols += [
            "ckpt stall $/day",
            "ckpt stall $/year",
            "rework $/day",
            "restart $/day",
            "waste $/day",
            "waste $/year",
        ]
    for col in cols:
        table.add_column(col, justify="right")
    for r in rows:
        cells = [
            f"{r.gpus:,}", f"{r.mtbf_hours:.2f} h", human_seconds(r.blocking_s), human_seconds(r.restart_s),
            human_seconds(r.interval_s) + ("" if r.optimal_interval else " (fixed)"), f"{r.checkpoints_per_day:,.0f}",
            f"{100 * r.waste_fraction:.2f}%", f"{100 * r.restart_fraction:.2f}%", f"{r.wasted_gpu_hours_per_day:,.0f}",
        ]  # fmt: skip
        if priced:
            cells += [_usd(v) for v in (r.checkpoint_stall_cost_per_day, r.checkpoint_stall_cost_per_year, r.rework_cost_per_day,
                                        r.restart_cost_per_day, r.total_waste_cost_per_day, r.total_waste_cost_per_year)]  # fmt: skip
        table.add_row(*cells)
    console.print(table)
    if any(not r.valid for r in rows):
        console.print(
            "note: rows where the interval reaches the MTBF or waste reaches 100% are outside the first-order model",
            markup=False,
            style="dim",
        )


def _usd(v: float) -> str:
    return f"${v / 1e6:,.1f}M" if v >= 1e6 else f"${v / 1e3:,.1f}K" if v >= 1e4 else f"${v:,.0f}"


def _age(t: Any) -> str:
    from datetime import datetime, timezone

    if t is None:
        return "never"
    s = (datetime.now(timezone.utc) - t).total_seconds()
    return (
        f"{s / 86400:.1f} d ago"
        if s >= 86400
        else f"{s / 3600:.1f} h ago"
        if s >= 3600
        else f"{max(0.0, s) / 60:.0f} min ago"
    )


def render_runs(console: Out, runs: list[Any]) -> None:
    """``drill runs``: one line per run on the record, those needing attention first."""
    table = _table(header_style="bold")
    for col in ("run", "retained", "proven", "never drilled", "last drill", "verdict"):
        table.add_column(
            col,
            justify="right" if col in ("retained", "proven", "never drilled") else "left",
            overflow="fold" if col == "run" else "ellipsis",
        )
    for r in runs:
        last = r.last
        table.add_row(
            escape(r.run_root), str(r.coverage.retained), str(r.proven), str(len(r.coverage.never_drilled)),
            _age(last.started_at) if last else "never", _styled(last.status) if last else "-",
        )  # fmt: skip
    console.print(table)


def render_run(console: Out, run: Any) -> None:
    """``drill runs ROOT``: every checkpoint of the run, as restic's snapshots lists a repository's."""
    console.print(
        f"[bold]{escape(run.run_root)}[/]  {run.proven} of {run.coverage.retained} retained checkpoints proven restorable"
    )
    if run.retention_note:
        console.print(run.retention_note, markup=False, style="dim")
    table = _table(header_style="bold")
    for col in (
        "checkpoint",
        "step",
        "retained",
        "proven",
        "last verdict",
        "evidence",
        "replay",
        "last drill",
        "on storage",
    ):
        table.add_column(col, justify="right" if col in ("step", "on storage") else "left")
    for k in run.checkpoints:
        table.add_row(
            escape(k.name), str(k.step) if k.step is not None else "-", {True: "yes", False: "purged", None: "?"}[k.retained],
            "[green]yes[/]" if k.proven else "[red]no[/]", _styled(k.last_status) if k.last_status else "never",
            escape(k.evidence_level or "-"), escape(k.proof.replay if k.proof else "-"), _age(k.last_drilled_at), human_bytes(k.bytes_on_storage),
        )  # fmt: skip
    console.print(table)
    ckpts, data = run.coverage.describe()
    console.print(f"coverage: {ckpts}; {data}", markup=False, style="dim")
