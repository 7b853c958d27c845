"""Inline SVG charts for the HTML report: no script, no fonts or images fetched, print-safe."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from html import escape

STATUS_COLORS = {
    "passed": "#15803d",
    "failed": "#dc2626",
    "error": "#7c3aed",
    "slo_breach": "#d97706",
    "aborted": "#6b7280",
    "running": "#0ea5e9",
}


@dataclass(frozen=True, slots=True)
class Point:
    at: datetime
    value: float
    label: str
    """The tooltip: which drill, what verdict."""
    ok: bool


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    color: str
    points: Sequence[Point]
    p95: float | None = None


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(v))
    for step in (1, 2, 2.5, 5, 10):
        if v <= step * magnitude:
            return step * magnitude
    return 10 * magnitude


def line_chart(
    title: str, series: Sequence[Series], fmt: Callable[[float], str], *, width: int = 720, height: int = 230
) -> str:
    """Values over time, one line per series, failed drills as hollow red points, p95 dashed."""
    pts = [p for s in series for p in s.points]
    if not pts:
        return ""
    left, right, top, bottom = 64, 16, 34, 34
    t0, t1 = min(p.at for p in pts).timestamp(), max(p.at for p in pts).timestamp()
    ymax = _nice_max(max([p.value for p in pts] + [s.p95 or 0 for s in series]) * 1.05)
    x = lambda t: left + ((t - t0) / (t1 - t0) if t1 > t0 else 0.5) * (width - left - right)  # noqa: E731
    y = lambda v: top + (1 - v / ymax) * (height - top - bottom)  # noqa: E731
    out = [
        f'<svg class="chart" role="img" aria-label="{escape(title)}" viewBox="0 0 {width} {height}" width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">'
    ]
    out.append(f'<text x="{left}" y="18" class="ct">{escape(title)}</text>')
    out += _axes(left, right, top, bottom, width, height, ymax, y, fmt, t0, t1, x)
    for i, s in enumerate(series):
        out += _series(s, x, y, left, width - right)
        lx = width - right - 150 * (len(series) - i)
        out.append(
            f'<rect x="{lx}" y="9" width="12" height="4" fill="{s.color}"/><text x="{lx + 16}" y="15" class="cl">{escape(s.name)}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def _axes(
    left: int,
    right: int,
    top: int,
    bottom: int,
    width: int,
    height: int,
    ymax: float,
    y: Callable[[float], float],
    fmt: Callable[[float], str],
    t0: float,
    t1: float,
    x: Callable[[float], float],
) -> list[str]:
    out = []
    for i in range(5):
        v = ymax * i / 4
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" class="grid"/>')
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" class="ax" text-anchor="end">{escape(fmt(v))}</text>')
    ticks = [t0 + (t1 - t0) * i / 4 for i in range(5)] if t1 > t0 else [t0]
    for i, t in enumerate(ticks):
        span = t1 - t0
        label = datetime.fromtimestamp(t, timezone.utc).strftime(
            "%Y-%m-%d" if span > 4 * 86400 else "%Y-%m-%d %H:%M"
        )  # a time is never shown without its date
        anchor = "middle" if len(ticks) == 1 or 0 < i < len(ticks) - 1 else ("start" if i == 0 else "end")
        out.append(f'<text x="{x(t):.1f}" y="{height - bottom + 18}" class="ax" text-anchor="{anchor}">{label}</text>')
    out.append(f'<line x1="{left}" x2="{width - right}" y1="{height - bottom}" y2="{height - bottom}" class="axis"/>')
    return out


def _series(s: Series, x: Callable[[float], float], y: Callable[[float], float], x0: float, x1: float) -> list[str]:
    pts = sorted(s.points, key=lambda p: p.at)
    out = []
    if len(pts) > 1:
        path = " ".join(f"{x(p.at.timestamp()):.1f},{y(p.value):.1f}" for p in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{s.color}" stroke-width="2"/>')
    if s.p95 is not None:
        out.append(
            f'<line x1="{x0}" x2="{x1}" y1="{y(s.p95):.1f}" y2="{y(s.p95):.1f}" stroke="{s.color}" stroke-dasharray="5 4" stroke-width="1"/>'
        )
        out.append(
            f'<text x="{x1 - 4}" y="{y(s.p95) - 4:.1f}" class="cl" text-anchor="end" fill="{s.color}">p95 {escape(s.name)}</text>'
        )
    for p in pts:
        fill, stroke = (s.color, s.color) if p.ok else ("#ffffff", STATUS_COLORS["failed"])
        out.append(
            f'<circle cx="{x(p.at.timestamp()):.1f}" cy="{y(p.value):.1f}" r="4" fill="{fill}" stroke="{stroke}" stroke-width="2"><title>{escape(p.label)}</title></circle>'
        )
    return out


def status_strip(drills: Sequence[tuple[str, str]], *, width: int = 720, height: int = 26) -> str:
    """One cell per drill, oldest first, colored by verdict: (status, tooltip)."""
    if not drills:
        return ""
    cell = min(24.0, (width - 2) / len(drills))
    out = [
        f'<svg class="strip" role="img" aria-label="drill verdicts, oldest first" viewBox="0 0 {width} {height}" width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">'
    ]
    for i, (status, label) in enumerate(drills):
        color = STATUS_COLORS.get(status, "#9ca3af")
        out.append(
            f'<rect x="{1 + i * cell:.1f}" y="3" width="{max(1.0, cell - 2):.1f}" height="{height - 6}" rx="2" fill="{color}"><title>{escape(label)}</title></rect>'
        )
    out.append("</svg>")
    return "".join(out)


def share_bar(parts: Sequence[tuple[float, str, str]], *, width: int = 240, height: int = 14) -> str:
    """A horizontal bar of shares (0–1) with their colors and tooltips; the rest is grey."""
    out = [
        f'<svg class="bar" viewBox="0 0 {width} {height}" width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg"><rect width="{width}" height="{height}" rx="3" fill="#e5e7eb"/>'
    ]
    at = 0.0
    for share, color, label in parts:
        w = max(0.0, min(1.0, share)) * width
        out.append(
            f'<rect x="{at:.1f}" width="{w:.1f}" height="{height}" rx="3" fill="{color}"><title>{escape(label)}</title></rect>'
        )
        at += w
    out.append("</svg>")
    return "".join(out)


__all__ = ["STATUS_COLORS", "Point", "Series", "line_chart", "share_bar", "status_strip"]


def bars(
    title: str,
    values: Sequence[tuple[str, float]],
    fmt: Callable[[float], str],
    *,
    mark: float | None = None,
    width: int = 720,
    height: int = 200,
) -> str:
    """One bar per label (e.g. aggregate bandwidth per reader count), ``mark`` a dashed line (a ceiling)."""
    if not values:
        return ""
    left, right, top, bottom = 64, 16, 34, 30
    ymax = _nice_max(max([v for _, v in values] + [mark or 0]) * 1.05)
    y = lambda v: top + (1 - v / ymax) * (height - top - bottom)  # noqa: E731
    slot = (width - left - right) / len(values)
    out = [f'<svg class="chart" role="img" aria-label="{escape(title)}" viewBox="0 0 {width} {height}" width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">',
           f'<text x="{left}" y="18" class="ct">{escape(title)}</text>',
           f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#9ca3af"/>',
           f'<text x="{left - 6}" y="{y(ymax) + 4:.1f}" text-anchor="end" class="ax">{escape(fmt(ymax))}</text>']  # fmt: skip
    for i, (label, v) in enumerate(values):
        x0 = left + i * slot + slot * 0.2
        out.append(
            f'<rect x="{x0:.1f}" y="{y(v):.1f}" width="{slot * 0.6:.1f}" height="{height - bottom - y(v):.1f}" fill="#2563eb"><title>{escape(label)}: {escape(fmt(v))}</title></rect>'
        )
        out.append(
            f'<text x="{x0 + slot * 0.3:.1f}" y="{height - bottom + 16}" text-anchor="middle" class="ax">{escape(label)}</text>'
        )
    if mark is not None:
        out.append(
            f'<line x1="{left}" y1="{y(mark):.1f}" x2="{width - right}" y2="{y(mark):.1f}" stroke="#dc2626" stroke-dasharray="5 4"><title>ceiling {escape(fmt(mark))}</title></line>'
        )
    out.append("</svg>")
    return "".join(out)
