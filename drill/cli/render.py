"""Rendering drill results for people. Library objects in, rich output on stdout."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from drill.findings import CheckResult, Severity
from drill.units import human_bytes, human_rate, human_seconds

if TYPE_CHECKING:  # drill verify renders checks without importing torch
    from drill.runner import DrillOutcome

STATUS_STYLE = {
    "passed": "bold green",
    "slo_breach": "bold yellow",
    "failed": "bold red",
    "error": "bold magenta",
    "aborted": "bold yellow",
    "running": "cyan",
    "skipped": "dim",
}


def _styled(status: str) -> str:
    return f"[{STATUS_STYLE.get(status, '')}]{status.upper()}[/]"


def outcome_document(outcome: DrillOutcome, db_url: str) -> dict[str, Any]:
    """The ``drill run --json`` document."""
    t = outcome.timings
    busy = (t.read or 0) + (t.load or 0)
    ref = outcome.checkpoint
    return {
        "drill_id": outcome.drill_id,
        "status": outcome.status,
        "exit_code": int(outcome.exit_code),
        "message": outcome.message,
        "checkpoint": None if ref is None else {"uri": ref.uri, "name": ref.name, "step": ref.step, "format": ref.format},
        "device": outcome.device,
        "restore_seconds": t.restore,
        "phases": {"discover": t.discover, "read": t.read, "load": t.load, "checks": t.checks},
        "ttfs_seconds": t.ttfs,
        "bytes_read": outcome.bytes_read,
        "throughput_bps": (outcome.bytes_read / busy) if outcome.bytes_read and busy else None,
        "checks": [
            {
                "name": c.name,
                "status": c.status.value,
                "summary": c.summary,
                "seconds": c.seconds,
                "findings": [f.to_dict() for f in c.findings],
            }
            for c in outcome.checks
        ],
        "database": db_url,
    }


def render_findings(console: Console, findings: list) -> None:  # type: ignore[type-arg]
    for f in findings:
        if f.severity is Severity.INFO:
            continue
        colour = "red" if f.severity is Severity.ERROR else "yellow"
        where = escape(f" [{f.subject}]") if f.subject else ""
        console.print(f"[{colour}]{f.severity.value}[/] {f.code}{where}: ", end="")
        console.print(f.message, markup=False)
        if f.hint:
            console.print(f"  hint: {f.hint}", markup=False, style="dim")


def render_check(console: Console, check: CheckResult) -> None:
    console.print(f"[bold]{escape(check.name)}[/] {_styled(check.status.value)}  ", end="")
    console.print(check.summary, markup=False)
    render_findings(console, check.findings)


def render_outcome(console: Console, outcome: DrillOutcome, db_url: str) -> None:
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    table.add_column("check")
    table.add_column("status")
    table.add_column("evidence")
    for c in outcome.checks:
        table.add_row(escape(c.name), _styled(c.status.value), escape(c.summary))
    if outcome.checks:
        console.print(table)
    if any(f.severity is not Severity.INFO for f in outcome.findings):
        console.print()
    render_findings(console, outcome.findings)
    t = outcome.timings
    ref = outcome.checkpoint
    console.print()
    target = f"{ref.name} (step {ref.step})" if ref and ref.step is not None else (ref.name if ref else "no checkpoint")
    console.print(f"{_styled(outcome.status)}  drill #{outcome.drill_id}  {escape(target)}  on {outcome.device}")
    if t.restore is not None:
        busy = (t.read or 0) + (t.load or 0)
        rate = human_rate(outcome.bytes_read / busy) if outcome.bytes_read and busy else "-"
        console.print(
            f"restore {human_seconds(t.restore)} (discover {human_seconds(t.discover)}, read {human_seconds(t.read)}, "
            f"load {human_seconds(t.load)}); checks {human_seconds(t.checks)}; "
            f"{human_bytes(outcome.bytes_read)} at {rate}",
            markup=False,
        )
    if t.ttfs is not None:
        console.print(f"time to first step {human_seconds(t.ttfs)} (drill start → first replayed step done)", markup=False)
    console.print(f"recorded in {db_url}  (drill show {outcome.drill_id})", markup=False, style="dim")
    if outcome.status == "failed" and ref is not None:
        console.print(f"re-check the bytes without restoring: drill verify {ref.uri}", markup=False, style="dim")


def render_history(console: Console, drills: list[dict[str, Any]]) -> None:
    table = Table(header_style="bold", box=None, pad_edge=False)
    for col in ("id", "started (UTC)", "status", "checkpoint", "restore", "read", "rate", "trigger"):
        table.add_column(col, justify="right" if col in ("id", "restore", "read", "rate") else "left")
    for d in drills:
        ck = d["checkpoint"]
        table.add_row(
            str(d["id"]),
            d["started_at"][:19].replace("T", " "),
            _styled(d["status"]),
            escape(ck["uri"] if ck else d["run_root"]),
            human_seconds(d["restore_seconds"]),
            human_bytes(d["bytes_read"]),
            human_rate(d["throughput_bps"]),
            d["trigger"],
        )
    console.print(table)


def render_drill(console: Console, d: dict[str, Any]) -> None:
    ck = d["checkpoint"]
    console.print(f"drill #{d['id']}  {_styled(d['status'])}")
    rows = [
        ("checkpoint", f"{ck['uri']} (step {ck['step']}, {ck['format']}, {human_bytes(ck['bytes'])} in {ck['files']} files)" if ck else "-"),
        ("run root", d["run_root"]),
        ("selector", d["selector"]),
        ("trigger", d["trigger"] + (f" (policy {d['policy']})" if d.get("policy") else "")),
        ("selection", d.get("selection") or "-"),
        ("host / pid", f"{d['host']} / {d['pid']}"),
        ("device", d["device"]),
        ("started", d["started_at"]),
        ("finished", d["finished_at"] or f"- (last phase: {d['phase']})"),
        ("restore", human_seconds(d["restore_seconds"])),
        ("first step", f"{human_seconds(d['ttfs_seconds'])} (replay {d['replay_verdict'] or 'not run'})"),
        ("phases", ", ".join(f"{k} {human_seconds(v)}" for k, v in d["phases"].items())),
        ("read", f"{human_bytes(d['bytes_read'])} at {human_rate(d['throughput_bps'])}"),
        ("evidence", f"{d.get('evidence_level') or '-'}, sample {d.get('sample') or '-'}"),
        ("SLO", "; ".join(b["message"] for b in (d.get("slo_breaches") or {}).values()) or "met (or none set)"),
        ("versions", f"drill {d['drill_version']}, torch {d['torch_version']}"),
    ]
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for k, v in rows:
        table.add_row(k, escape(str(v)))
    console.print(table)
    if d.get("error"):
        console.print("error:", style="bold")
        console.print(d["error"], markup=False)
    for c in d.get("checks", []):
        console.print()
        console.print(f"[bold]{escape(c['name'])}[/] {_styled(c['status'])}  ", end="")
        console.print(c["summary"], markup=False)
        for f in c["evidence"].get("findings", []):
            where = f" [{f['subject']}]" if f.get("subject") else ""
            console.print(f"  {f['severity']} {f['code']}{where}: {f['message']}", markup=False)
            if f.get("hint"):
                console.print(f"    hint: {f['hint']}", markup=False, style="dim")


def render_scheduler(console: Console, state: dict[str, Any]) -> None:
    sched = state["scheduler"]
    if state["alive"]:
        console.print(
            f"scheduler [bold green]ALIVE[/]  {escape(sched['host'])} pid {sched['pid']}, "
            f"heartbeat {sched['heartbeat_age_seconds']:.0f} s ago, since {sched['started_at'][:19]}"
        )
    elif sched:
        console.print(f"scheduler [bold red]NOT RUNNING[/]  last heartbeat {sched['heartbeat_at'][:19]} from {escape(sched['host'])} pid {sched['pid']}")
    else:
        console.print("scheduler [bold red]NOT RUNNING[/]  (never started on this database)")
    table = Table(header_style="bold", box=None, pad_edge=False)
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
