"""An audit report as CSV: one row per drill in the window, for a spreadsheet or a ticket.

Every field is a plain value (ISO 8601 UTC times, seconds, bytes); a value that came from a
record and begins with ``=``, ``+``, ``-`` or ``@`` is prefixed with ``'`` so a spreadsheet
never evaluates it as a formula.
"""

from __future__ import annotations

import csv
import io

from drill.report.model import Report

COLUMNS = (
    "run_root", "drill_id", "started_at", "status", "exit_code", "checkpoint", "step", "evidence_level", "replay",
    "sample", "restore_seconds", "ttfs_seconds", "bytes_read", "throughput_bps", "trigger", "policy", "message", "rerun",
)  # fmt: skip


def _safe(value: object) -> object:
    if isinstance(value, str):
        from drill.text import printable

        value = printable(value)
        if value[:1] in ("=", "+", "-", "@"):
            return "'" + value
    return "" if value is None else value


def render_csv(report: Report) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for run in report.runs:
        for d in run.drills:
            row = [
                run.run_root, d.id, d.started_at.isoformat(), d.status, d.exit_code, d.checkpoint, d.step, d.evidence_level,
                d.replay["verdict"] if d.replay else "not run", d.sample, d.restore_s, d.ttfs_s, d.bytes_read, d.throughput_bps,
                d.trigger, d.policy, d.message, d.rerun,
            ]  # fmt: skip
            writer.writerow([_safe(v) for v in row])
    return out.getvalue()


__all__ = ["COLUMNS", "render_csv"]
