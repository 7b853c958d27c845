"""Assembling a :class:`~drill.report.model.Report` from the record database (and, where the
run root can be listed from this host, from storage: which checkpoints are still retained)."""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import func, select

from drill.claims import Retained, coverage, good_enough, proof_of
from drill.errors import DrillError
from drill.findings import Finding, Severity
from drill.goodput import GoodputError, measured_restart, table
from drill.pipeline.outcome import DrillOutcome
from drill.records.reporting import DrillBrief, KnownCheckpoint, Verified
from drill.report.model import CheckpointRow, DrillEntry, GoodputSection, Report, RunSection
from drill.stats import summarize

DEFAULT_GPUS = (4096, 16384, 65536)
LISTING_TIMEOUT = 60.0
"""Seconds a report (or the metrics) waits, by default, on one run's storage before it falls
back to what the records know, saying so."""
DEFAULT_BLOCKING_S = 60.0
DEFAULT_LISTED = 200


@dataclass(frozen=True, slots=True)
class ReportOptions:
    since: datetime | None = None
    until: datetime | None = None
    policy: str | None = None
    root: str | None = None
    gpus: Sequence[int] = DEFAULT_GPUS
    blocking_s: float = DEFAULT_BLOCKING_S
    price_per_gpu_hour: float | None = None
    list_storage: bool = True
    """List each run root to learn which checkpoints are retained now (else: as recorded)."""
    listing_timeout: float = LISTING_TIMEOUT
    """Seconds one run's listing may take (a storage that never answers, a listing that never ends)."""
    listed: int | None = DEFAULT_LISTED
    """Drills each run lists in full (the newest, and every failure among the newest as many
    again); None: every drill in the window. Counts, percentiles and coverage always cover
    every drill in the window."""
    verify_chain: bool = True
    """Walk the audit log and recompute the digest of every record the report rests on (the
    drills in the window, each checkpoint's latest); else only the last full pass is reported
    (what the metrics do: a scrape never verifies)."""


def build_report(db: str | None = None, options: ReportOptions | None = None) -> Report:
    from drill.records.db import read_database, resolve_url, safe_url
    from drill.records.store import Records
    from drill.storage import normalize

    opts = options or ReportOptions()
    root = normalize(opts.root) if opts.root else None
    now = datetime.now(timezone.utc)
    report = Report(
        now, opts.since, opts.until or now, opts.policy, root, safe_url(resolve_url(db)), chain=_empty_chain()
    )
    database = read_database(db)
    if database is None:
        if root is not None:
            report.runs.append(_section(None, root, [], opts))
        return report
    try:
        records = Records(database)
        briefs = records.briefs_in_window(since=opts.since, until=report.until, policy=opts.policy, run_root=root)
        # Runs drilled before but not in the window appear too: a run whose drills stopped is news.
        by_root: dict[str, list[DrillBrief]] = {
            r: [] for r in ([root] if root else records.run_roots(policy=opts.policy))
        }
        for b in briefs:
            by_root.setdefault(b.run_root, []).append(b)
        runs = [_section(records, r, by_root[r], opts, resolve_url(db)) for r in sorted(by_root)]
        report.runs = sorted(runs, key=lambda r: (not r.needs_attention, r.run_root))  # what needs attention first
        rests_on = {b.id for b in briefs} | {c.last_drill_id for r in runs for c in r.checkpoints if c.last_drill_id}
        report.chain = _chain(database, rests_on, opts.verify_chain)
    finally:
        database.close()
    return report


def _empty_chain() -> dict[str, Any]:
    from drill.records.audit import ChainReport

    return ChainReport().to_dict()


def _chain(database: Any, rests_on: set[int], verify: bool) -> dict[str, Any]:
    """The audit log as this report rests on it: every record it reports (the drills in its
    window, each checkpoint's latest) checked against its entry — the entry's hash and HMAC,
    its link to the next, the record's digest (``verify``; :func:`~drill.records.audit.attest`)
    — beside the last full pass of ``drill audit verify`` and its time. A report on a year of
    records stays quick: the full pass is ``drill audit verify``'s."""
    from drill.api import audit_key
    from drill.records.audit import ChainReport, attest, chain_head, last_pass
    from drill.records.models import AuditEntry

    key = audit_key()
    with database.sessions.begin() as s:
        chain = ChainReport(scope="none (the last full pass is reported)", head=chain_head(s))
        chain.entries = s.scalar(select(func.count()).select_from(AuditEntry)) or 0
        if verify:
            chain.scope = f"the {len(rests_on)} record(s) reported"
            seals = attest(s, rests_on, key)
            chain.problems = [
                Finding(
                    check="audit",
                    code=seal.code or "record-edited",
                    severity=Severity.ERROR,
                    subject=f"drill #{i}",
                    message=seal.message or "",
                )
                for i, seal in sorted(seals.items())
                if seal.broken
            ]
            chain.records = sum(1 for seal in seals.values() if seal.state == "intact")
        done = last_pass(s, key)
    chain.last_full = done.to_dict() if done is not None else None
    return chain.to_dict()


# -- one run --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _OnStorage:
    uri: str
    name: str
    step: int | None
    format: str | None
    bytes: int | None
    """What it occupies on storage now; None when it could not be listed (or was not)."""


def _section(
    records: Any, root: str, briefs: list[DrillBrief], opts: ReportOptions, database: str | None = None
) -> RunSection:
    recent = {k.uri: k for k in records.known_checkpoints(root, seen_since=opts.since)} if records else {}
    retained, source, note = _retained(root, recent, opts.list_storage, opts.listing_timeout)
    uris = {c.uri for c in retained} | {b.checkpoint for b in briefs if b.checkpoint}
    known = {k.uri: k for k in records.known_checkpoints(root, uris=uris)} if records else {}
    latest = records.latest_drills(root, uris) if records else {}
    ledger = records.ledger(root, uris) if records else {}
    rows = _checkpoint_rows(retained, known, latest, ledger, briefs, opts.since, opts.until)
    saved = {}
    for save in reversed(records.saves(root, uris)) if records else []:
        saved[save["checkpoint"]] = save  # the newest save of each checkpoint wins
    for row in rows:
        row.sealed_at_save = saved.get(row.uri)
    cover = coverage(
        Retained(r.name, r.bytes_on_storage, r.drills_in_window > 0, r.bytes_verified_in_window)
        for r in rows
        if r.retained is not False
    )
    listed = records.outcomes(_listed(briefs, opts.listed)) if records else []
    return RunSection(
        run_root=root,
        policies=sorted({b.policy for b in briefs if b.policy}),
        retention=source,
        retention_note=note,
        checkpoints=rows,
        coverage=cover,
        counts=dict(Counter(b.status for b in briefs)),
        restore=summarize([b.restore for b in briefs]),
        ttfs=summarize([b.ttfs for b in briefs]),
        throughput=summarize([b.throughput for b in briefs]),
        drills=[drill_entry(d, database) for d in listed],
        drills_in_window=len(briefs),
        goodput=_goodput(briefs, opts),
        burst=(records.bursts(root, limit=1) or [None])[0] if records else None,
    )


def _listed(briefs: list[DrillBrief], limit: int | None) -> list[int]:
    """The drills a run lists in full: the newest ``limit``, and every drill that did not pass
    among the newest ``2 × limit`` (a failure is what an auditor reads first)."""
    if limit is None:
        return [b.id for b in briefs]
    newest = briefs[-limit:] if limit else []
    failures = [b for b in briefs[-2 * limit :] if b.status not in ("passed", "running")] if limit else []
    return sorted({b.id for b in (*newest, *failures)})


def _retained(
    root: str, known: dict[str, KnownCheckpoint], list_storage: bool, timeout: float = LISTING_TIMEOUT
) -> tuple[list[_OnStorage], str, str | None]:
    """Each retained checkpoint with its bytes on storage, where the list came from, and why."""
    if list_storage:
        from drill.discover import discover
        from drill.interrupts import deadline
        from drill.storage import storage_for

        try:
            with deadline(timeout, f"listing {root}"):  # one run's storage never holds the report hostage
                storage = storage_for(root)
                found = discover(storage, root)
                return (
                    [
                        _OnStorage(c.uri, c.name, c.step, c.format, bytes_on_storage(storage, c.uri))
                        for c in found.checkpoints
                    ],
                    "storage",
                    None,
                )
        except (OSError, DrillError) as exc:
            note = f"{root} could not be listed from this host ({getattr(exc, 'strerror', None) or exc}): checkpoints as drills last saw them"
    else:
        note = "storage not listed (--no-list): checkpoints as drills last saw them"
    rows = [_OnStorage(k.uri, _name(k.uri), k.step, k.format, None) for k in known.values()]
    return rows, "records", note


def bytes_on_storage(storage: Any, uri: str) -> int | None:
    """What a checkpoint occupies on storage now — every file, its manifest excluded (what
    coverage measures proofs against); None when it cannot be listed."""
    from drill.integrity.manifest import list_files

    try:
        entry = storage.stat(uri)
        return entry.size if not entry.is_dir else sum(list_files(storage, uri).files.values())
    except OSError:
        return None


def _checkpoint_rows(
    retained: list[_OnStorage],
    known: dict[str, KnownCheckpoint],
    latest: dict[str, DrillOutcome],
    ledger: dict[str, list[Verified]],
    briefs: list[DrillBrief],
    since: datetime | None,
    until: datetime | None = None,
) -> list[CheckpointRow]:
    in_window = Counter(b.checkpoint for b in briefs if b.checkpoint)
    listed = {c.uri for c in retained}
    purged = [
        _OnStorage(
            uri,
            _name(uri),
            known[uri].step if uri in known else None,
            known[uri].format if uri in known else None,
            None,
        )
        for uri in in_window
        if uri not in listed
    ]
    rows = []
    for c in [*retained, *purged]:
        k, last, files = known.get(c.uri), latest.get(c.uri), ledger.get(c.uri, [])
        rows.append(
            CheckpointRow(
                uri=c.uri, name=c.name, step=c.step, format=c.format, bytes=k.bytes if k else None, retained=c.uri in listed,
                bytes_on_storage=c.bytes, last_drill_id=last.id if last else None, last_status=last.status.value if last else None,
                last_drilled_at=last.started_at if last else None, proof=proof_of(last) if last else None,
                proven=last is not None and good_enough(last),
                bytes_verified=sum(f.size for f in files),
                bytes_verified_in_window=sum(f.size for f in files if (since is None or f.at >= since) and (until is None or f.at < until)),
                verified_at=max((f.at for f in files), default=None), drills_in_window=in_window.get(c.uri, 0),
            )
        )  # fmt: skip
    return sorted(rows, key=lambda r: (r.step is None, r.step or 0, r.uri))


def _name(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


# -- one drill ------------------------------------------------------------------------------
def drill_entry(o: DrillOutcome, database: str | None = None) -> DrillEntry:
    integrity = o.check("integrity")
    ev = integrity.evidence if integrity else {}
    findings = [
        {**f.to_dict(), "check": c.name}
        for c in o.checks
        for f in c.findings
        if f.severity in (Severity.ERROR, Severity.WARNING)
    ]
    return DrillEntry(
        id=o.id, started_at=o.started_at, status=o.status.value, exit_code=int(o.exit_code), message=o.message,
        checkpoint=o.checkpoint.uri if o.checkpoint else None, step=o.checkpoint.step if o.checkpoint else None,
        trigger=o.trigger, policy=o.policy, device=o.device, evidence_level=o.evidence_level, sample=o.sample,
        restore_s=o.timings.restore, ttfs_s=o.timings.ttfs, bytes_read=o.bytes_read, throughput_bps=o.throughput_bps,
        checks=[{"name": c.name, "status": c.status.value, "summary": c.summary} for c in o.checks],
        integrity={
            "summary": integrity.summary if integrity else None, "manifests": ev.get("manifests"),
            "bytes_verified": ev.get("bytes_verified"), "bytes_listed": ev.get("bytes_listed"), "authenticated": ev.get("authenticated"),
        },
        replay=None if o.replay is None else {"verdict": o.replay.verdict, "reason": o.replay.reason, "steps": o.replay.steps},
        findings=findings, slo_breaches=[str(b.get("message", b)) for b in o.slo_breaches.values()], rerun=rerun_command(o, database),
    )  # fmt: skip


def rerun_command(o: DrillOutcome, database: str | None = None) -> str:
    """The command that drills the same checkpoint again, the same way: its policy's, or every
    option it was run with (:meth:`~drill.pipeline.request.DrillRequest.flags`), and the
    database it was recorded in (without a password)."""
    from drill.records.urls import url_without_password

    db = ["--db", url_without_password(database)] if database else []
    policy_file = o.options.get("policy_file")
    if policy_file:
        return shell_join(["drill", "run", "--policy", policy_file, *db])
    target = ["--checkpoint", o.checkpoint.uri] if o.checkpoint else ["--root", o.run_root, "--checkpoint", o.selector]
    flags = o.options.get("flags")
    flags = list(flags) if isinstance(flags, list) else ["--device", o.device]  # recorded before drill kept its options
    return shell_join(["drill", "run", *target, *flags, *db])


def shell_join(argv: list[str]) -> str:
    """``shlex.join``, but an argument holding control characters (a hostile file name) is
    written as ``$'…'`` with escapes: what is shown is still the command that runs."""
    from drill.text import printable

    out = []
    for arg in argv:
        if printable(arg) == arg:
            out.append(shlex.quote(arg))
        else:
            out.append("$'" + printable(arg.replace("\\", "\\\\")).replace("'", "\\'") + "'")
    return " ".join(out)


# -- goodput --------------------------------------------------------------------------------
def _goodput(briefs: list[DrillBrief], opts: ReportOptions) -> GoodputSection | None:
    samples = [(b.ttfs, b.restore) for b in briefs if b.ttfs is not None]
    if not samples:
        return None
    try:
        restart = measured_restart(samples)
        rows = table(
            gpus=list(opts.gpus),
            blocking_s=[opts.blocking_s],
            restart_s=[restart.restart_s],
            price_per_gpu_hour=opts.price_per_gpu_hour,
        )
    except GoodputError:
        return None
    return GoodputSection(restart=restart, blocking_s=opts.blocking_s, rows=rows)


__all__ = [
    "DEFAULT_BLOCKING_S",
    "DEFAULT_GPUS",
    "DEFAULT_LISTED",
    "ReportOptions",
    "build_report",
    "drill_entry",
    "rerun_command",
]
