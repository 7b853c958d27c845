"""Sizes, durations and rates: one parser per concept (shared by CLI flags and policy files)
and the human-readable forms drill prints.

Sizes accept decimal (``500MB``, ``2G``) and binary (``16GiB``, ``16Gi``) units, as both
Kubernetes and storage vendors write them; durations accept ``90``, ``90s``, ``10m``, ``2h``,
``7d``. Each parser raises ``ValueError`` with a sentence saying what it expected.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta, timezone
from typing import Any

_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGTP]?)(i?)(B?)\Z", re.I)
_POWERS = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\Z")
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def decimal(text: str) -> int | None:
    """The non-negative integer ``text`` writes in ASCII digits — a step, a rank or a count as a
    file, a key or an option names one — else None. Not ``str.isdigit``: it admits "²" and "①",
    which ``int`` refuses, and "٣", which ``int`` reads as 3."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 4000 else None


def parse_size(value: Any) -> int:
    """``1048576``, ``500MB``, ``2G``, ``16GiB``, ``16Gi``, ``1TB`` → bytes (positive)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size (e.g. 16GiB, 500MB)")
    if isinstance(value, int):
        nbytes = value
    else:
        m = _SIZE.match(str(value).strip())
        if not m:
            raise ValueError(f"{value!r} is not a size (e.g. 16GiB, 16Gi, 500MB, 2G)")
        number, prefix, binary, _ = m.groups()
        if binary and not prefix:
            raise ValueError(f"{value!r} is not a size (e.g. 16GiB, 16Gi, 500MB, 2G)")
        base = 1024 if binary else 1000
        nbytes = int(float(number) * base ** _POWERS[prefix.upper()])
    if nbytes <= 0:
        raise ValueError(f"size {value!r} must be positive")
    return nbytes


LONGEST_WAIT = 1e9
"""Seconds (31 years) any timeout drill sets is held to: a longer one is as good as none, and
past about 9.2e9 neither the interval timer nor a poll can be set at all (``--timeout 1e12``
was an ``OverflowError``)."""


def bounded_wait(seconds: float) -> float:
    """``seconds``, at most :data:`LONGEST_WAIT`: what a timer or a poll is given."""
    return min(seconds, LONGEST_WAIT)


def parse_duration(value: Any) -> float:
    """``90``, ``"90s"``, ``"10m"``, ``"2h"``, ``"7d"``, ``"250ms"`` → seconds (finite, ≥ 0)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration (e.g. 90s, 10m, 2h, 7d)")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        m = _DURATION.match(str(value).strip())
        if not m:
            raise ValueError(f"{value!r} is not a duration (e.g. 90s, 10m, 2h, 7d)")
        seconds = float(m.group(1)) * _SECONDS[m.group(2)]
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"duration {value!r} must be a finite number of seconds, not negative")
    return seconds


def parse_instant(value: Any, *, now: datetime, end: bool = False) -> datetime:
    """A point in time as a report window takes it: a date (``2026-11-01``; with ``end``, the
    end of that day), an ISO 8601 time (``2026-11-01T06:00``, UTC unless it says otherwise),
    or a duration before ``now`` (``30d``, ``12h``). ``ValueError`` says which forms exist."""
    text = str(value).strip()
    try:
        return earlier(now, parse_duration(text))
    except ValueError:
        pass
    try:
        if len(text) == 10:  # a date alone
            day = datetime.fromisoformat(text).replace(tzinfo=timezone.utc)
            return _day_after(day, value) if end else day
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{value!r} is neither a date (2026-11-01), a time (2026-11-01T06:00Z) nor a duration (30d, 12h)"
        ) from None
    try:
        return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)
    except OverflowError:  # 0001-01-01T00:00+01:00 in UTC
        raise ValueError(f"{value!r} lies outside the years 1 to 9999 in UTC") from None


def earlier(now: datetime, seconds: float) -> datetime:
    """``seconds`` before ``now``; a span reaching back past the year 1 (``99999999d``, a
    coverage window of 1e300 days) is the beginning of time, not an ``OverflowError``."""
    try:
        return now - timedelta(seconds=seconds)
    except OverflowError:
        return datetime.min.replace(tzinfo=now.tzinfo)


def _day_after(day: datetime, value: Any) -> datetime:
    """The end of ``day`` (the start of the next); the last representable day ends at its last instant."""
    try:
        return day + timedelta(days=1)
    except OverflowError:
        return datetime.max.replace(tzinfo=timezone.utc)


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
