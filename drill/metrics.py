"""Prometheus gauges for node_exporter's textfile collector: is each run still proven
restorable, how fast does it restore, how much of it is covered.

    drill metrics --textfile /var/lib/node_exporter/textfile/drill.prom

The file is written atomically (a temporary file renamed over it), so the collector never
reads half of it. Series are labelled ``policy`` (empty for drills run by hand) and
``run_root``; coverage is per run root.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from drill.claims import LEVELS, proof_of
from drill.units import earlier
from drill.verdict import DrillStatus

STATUSES = [s.value for s in DrillStatus if s is not DrillStatus.RUNNING]
SOURCE = ["policy", "run_root"]


def _gauge(registry: Any, name: str, doc: str, labels: list[str]) -> Any:
    from prometheus_client import Gauge

    return Gauge(name, doc, labels, registry=registry)


def build_registry(db: str | None = None, *, coverage_days: float = 7.0, list_storage: bool = True) -> Any:
    """A ``prometheus_client`` registry holding every drill gauge, read from the record."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    now = time.time()
    _gauge(registry, "drill_metrics_generated_timestamp_seconds", "When these metrics were written.", []).set(now)
    latest, report, counts = _read(db, coverage_days, list_storage)
    _per_source(registry, latest, now)
    _per_run(registry, report)
    registry.register(_Counts(counts))
    _scheduler(registry, counts.get("scheduler") or {})
    _bursts(registry, counts.get("bursts") or {})
    _audit(registry, report.chain, latest)
    return registry


def _audit(registry: Any, chain: dict[str, Any], latest: dict[tuple[str, str], Any]) -> None:
    """The audit log as the last full pass of ``drill audit verify`` found it — a scrape never
    verifies the log — and the records this scrape read, each checked against its seal."""
    last = chain.get("last_full")
    broken = any(o is not None and o.seal is not None and o.seal.broken for pair in latest.values() for o in pair)
    _gauge(
        registry,
        "drill_audit_chain_intact",
        "1 when the last full pass of drill audit verify found the drill log intact and every record read now matches "
        "its seal; 0 when it did not, or when no pass was ever recorded.",
        [],
    ).set(1 if last and last.get("intact") and not broken else 0)
    if last:
        _gauge(
            registry,
            "drill_audit_verified_timestamp_seconds",
            "When the last full pass of drill audit verify ran (run it nightly: alert when this is old).",
            [],
        ).set(datetime.fromisoformat(last["verified_at"]).timestamp())
    _gauge(registry, "drill_audit_chain_entries", "Records sealed into the drill log.", []).set(
        (chain.get("head") or {}).get("seq", 0)
    )


def _read(
    db: str | None, coverage_days: float, list_storage: bool
) -> tuple[dict[tuple[str, str], Any], Any, dict[str, Any]]:
    from drill.records.db import read_database
    from drill.records.store import Records
    from drill.report.build import ReportOptions, build_report

    since = earlier(datetime.now(timezone.utc), coverage_days * 86400)
    options = ReportOptions(since=since, list_storage=list_storage, listed=0, verify_chain=False)  # counts, not drills
    report = build_report(db, options)
    database = read_database(db)
    if database is None:
        return {}, report, {}
    try:
        records = Records(database)
        latest, drills = records.sources()
        counts = {
            "drills": drills,
            "events": records.scheduler_event_counts(),
            "scheduler": records.scheduler_state(),
            "bursts": records.latest_bursts(),
        }
        return latest, report, counts
    finally:
        database.close()


class _Counts:
    """Counters read from the record (monotonic while records are kept): drills by verdict, so
    a failure and then a pass between two scrapes still leaves a trace (``increase()``), and
    scheduled drills that did not run."""

    def __init__(self, counts: dict[str, Any]) -> None:
        self.counts = counts

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        drills = CounterMetricFamily("drill_drills", "Drills recorded, by verdict.", labels=[*SOURCE, "status"])
        for (policy, root, status), n in sorted((self.counts.get("drills") or {}).items()):
            drills.add_metric([policy, root, status], n)
        yield drills
        events = CounterMetricFamily(
            "drill_scheduler_events",
            "Scheduled drills that did not run (missed, skipped, refused, error).",
            labels=["policy", "kind"],
        )
        for (policy, kind), n in sorted((self.counts.get("events") or {}).items()):
            events.add_metric([policy, kind], n)
        yield events


def _bursts(registry: Any, latest: dict[str, dict[str, Any]]) -> None:
    """The latest restore burst of each run: its ceiling, each step's aggregate, its R."""
    if not latest:
        return
    g = {
        "ceiling": _gauge(
            registry,
            "drill_burst_ceiling_bytes_per_second",
            "Best aggregate read bandwidth of the run's latest burst (the ceiling when one was reached).",
            ["run_root"],
        ),
        "step": _gauge(
            registry,
            "drill_burst_aggregate_bytes_per_second",
            "Aggregate read bandwidth of each step of the run's latest burst.",
            ["run_root", "readers"],
        ),
        "restart": _gauge(
            registry,
            "drill_burst_restart_seconds",
            "R computed from the run's latest burst (for the job size it was asked).",
            ["run_root"],
        ),
        "at": _gauge(registry, "drill_burst_timestamp_seconds", "When the run's latest burst ran.", ["run_root"]),
    }
    for root, doc in sorted(latest.items()):
        if doc.get("ceiling_bps") is not None:
            g["ceiling"].labels(root).set(doc["ceiling_bps"])
        for st in doc["steps"]:
            if st.get("aggregate_bps") is not None:
                g["step"].labels(root, str(st["readers"])).set(st["aggregate_bps"])
        if (doc.get("restart") or {}).get("restart_s") is not None:
            g["restart"].labels(root).set(doc["restart"]["restart_s"])
        g["at"].labels(root).set(datetime.fromisoformat(doc["started_at"]).timestamp())


def _scheduler(registry: Any, state: dict[str, Any]) -> None:
    _gauge(registry, "drill_scheduler_up", "1 while a scheduler holds a live lease on this database.", []).set(
        1 if state.get("alive") else 0
    )
    beat = (state.get("scheduler") or {}).get("heartbeat_age_seconds")
    if beat is not None:
        _gauge(
            registry, "drill_scheduler_heartbeat_age_seconds", "Seconds since the scheduler's last heartbeat.", []
        ).set(beat)


def _per_source(registry: Any, latest: dict[tuple[str, str], Any], now: float) -> None:
    g = {
        "verdict": _gauge(
            registry,
            "drill_last_verdict",
            "1 for the verdict of the latest drill, 0 for the others.",
            [*SOURCE, "status"],
        ),
        "exit": _gauge(registry, "drill_last_exit_code", "Exit code of the latest drill.", SOURCE),
        "at": _gauge(registry, "drill_last_drill_timestamp_seconds", "When the latest drill started.", SOURCE),
        "ok_at": _gauge(
            registry, "drill_last_success_timestamp_seconds", "When the latest passing drill started.", SOURCE
        ),
        "ok_age": _gauge(
            registry, "drill_last_success_age_seconds", "Seconds since the latest passing drill started.", SOURCE
        ),
        "restore": _gauge(registry, "drill_restore_seconds", "Restore latency of the latest drill.", SOURCE),
        "ttfs": _gauge(registry, "drill_ttfs_seconds", "Time to first step of the latest drill.", SOURCE),
        "read": _gauge(registry, "drill_read_bytes", "Bytes the latest drill read.", SOURCE),
        "verified": _gauge(
            registry, "drill_verified_bytes", "Bytes the latest drill verified against their seal.", SOURCE
        ),
        "evidence": _gauge(
            registry,
            "drill_last_evidence_level",
            "1 for the evidence the latest drill's verdict rests on (none, structural, sealed, authenticated).",
            [*SOURCE, "level"],
        ),
    }
    for (policy, root), (last, passed) in sorted(latest.items()):
        labels = (policy, root)
        for status in STATUSES:
            g["verdict"].labels(*labels, status).set(1 if last.status.value == status else 0)
        g["exit"].labels(*labels).set(int(last.exit_code))
        evidence = proof_of(last).evidence
        for level in LEVELS:
            g["evidence"].labels(*labels, level).set(1 if level == evidence else 0)
        g["at"].labels(*labels).set(last.started_at.timestamp())
        if passed is not None:
            g["ok_at"].labels(*labels).set(passed.started_at.timestamp())
            g["ok_age"].labels(*labels).set(max(0.0, now - passed.started_at.timestamp()))
        for key, value in (("restore", last.timings.restore), ("ttfs", last.timings.ttfs), ("read", last.bytes_read)):
            if value is not None:
                g[key].labels(*labels).set(value)
        integrity = last.check("integrity")
        if integrity is not None and isinstance(integrity.evidence.get("bytes_verified"), int):
            g["verified"].labels(*labels).set(integrity.evidence["bytes_verified"])


def _per_run(registry: Any, report: Any) -> None:
    g = {
        "retained": _gauge(registry, "drill_checkpoints_retained", "Retained checkpoints of the run.", ["run_root"]),
        "drilled": _gauge(
            registry,
            "drill_checkpoints_drilled",
            "Retained checkpoints drilled within the coverage window.",
            ["run_root"],
        ),
        "proven": _gauge(
            registry, "drill_checkpoints_proven", "Retained checkpoints whose latest drill passed.", ["run_root"]
        ),
        "coverage": _gauge(
            registry,
            "drill_coverage_ratio",
            "Share of retained checkpoints drilled within the coverage window.",
            ["run_root"],
        ),
        "bytes": _gauge(
            registry,
            "drill_verified_bytes_ratio",
            "Share of retained bytes verified within the coverage window.",
            ["run_root"],
        ),
    }
    for run in report.runs:
        c = run.coverage
        g["retained"].labels(run.run_root).set(c.retained)
        g["drilled"].labels(run.run_root).set(c.drilled_in_window)
        g["proven"].labels(run.run_root).set(sum(1 for k in run.checkpoints if k.proven and k.retained is not False))
        if c.share is not None:
            g["coverage"].labels(run.run_root).set(c.share)
        if c.share_bytes is not None:
            g["bytes"].labels(run.run_root).set(c.share_bytes)


def write_textfile(path: str, db: str | None = None, *, coverage_days: float = 7.0, list_storage: bool = True) -> int:
    """Write the gauges to ``path`` atomically, never through a link planted in the collector's
    directory (:func:`~drill.storage.local.write_file`); returns the number of series written."""
    from prometheus_client import generate_latest

    from drill.storage.local import write_file

    registry = build_registry(db, coverage_days=coverage_days, list_storage=list_storage)
    write_file(path, generate_latest(registry))
    return sum(len(m.samples) for m in registry.collect())


__all__ = ["build_registry", "write_textfile"]
