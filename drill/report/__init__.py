"""Audit reports: what the record proves about each run's checkpoints.

    from drill.report import ReportOptions, build_report, render

    report = build_report(db, ReportOptions(since=..., policy="pretrain-nightly"))
    html = render(report, "html")

:mod:`~drill.report.build` assembles a :class:`~drill.report.model.Report` from the record
database; :mod:`~drill.report.html`, :mod:`~drill.report.markdown`, :mod:`~drill.report.csvfile`
and ``json`` render it.
"""

from __future__ import annotations

from drill.report.build import ReportOptions, build_report
from drill.report.model import SCHEMA, Report

FORMATS = ("html", "md", "json", "csv")


def render(report: Report, fmt: str) -> str:
    if fmt == "html":
        from drill.report.html import render_html

        return render_html(report)
    if fmt == "md":
        from drill.report.markdown import render_markdown

        return render_markdown(report)
    if fmt == "json":
        from drill.findings import strict_json

        return strict_json(report.to_dict(), indent=2, ensure_ascii=False) + "\n"
    if fmt == "csv":
        from drill.report.csvfile import render_csv

        return render_csv(report)
    raise ValueError(f"unknown report format {fmt!r}: expected one of {', '.join(FORMATS)}")


__all__ = ["FORMATS", "SCHEMA", "Report", "ReportOptions", "build_report", "render"]
