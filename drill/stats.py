"""Order statistics for latency figures: p50/p95 the way dashboards compute them."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile (0–100) with linear interpolation between closest ranks
    (numpy's default); None for no values."""
    xs = sorted(v for v in values if v is not None and math.isfinite(v))
    if not xs:
        return None
    rank = (len(xs) - 1) * q / 100
    lo, hi = math.floor(rank), math.ceil(rank)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


@dataclass(frozen=True, slots=True)
class Summary:
    n: int
    p50: float | None
    p95: float | None
    max: float | None
    last: float | None

    def to_dict(self) -> dict[str, float | int | None]:
        return {"n": self.n, "p50": self.p50, "p95": self.p95, "max": self.max, "last": self.last}


def summarize(values: list[float | None]) -> Summary:
    """``values`` in time order (the last one is the latest); missing ones are skipped."""
    xs = [v for v in values if v is not None and math.isfinite(v)]
    return Summary(len(xs), percentile(xs, 50), percentile(xs, 95), max(xs) if xs else None, xs[-1] if xs else None)


__all__ = ["Summary", "percentile", "summarize"]
