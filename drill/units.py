"""Human-readable sizes, durations and rates for terminal output."""

from __future__ import annotations


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def human_rate(bps: float | None) -> str:
    return "-" if bps is None else human_bytes(bps) + "/s"


def human_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.2f} s"
    return f"{s / 60:.1f} min"
