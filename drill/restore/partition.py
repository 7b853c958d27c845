"""Which rank reads which file: every file exactly once, the bytes balanced across ranks."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


def assign(sizes: dict[str, int], world: int) -> list[list[str]]:
    """Files to ranks, largest first onto the least-loaded rank (LPT): within 4/3 of the best
    possible balance, and exact when the files are equal and the world divides them. The least
    loaded rank comes off a heap: files × log(ranks), not files × ranks (130,000 files onto
    16,384 ranks)."""
    import heapq

    heap = [(0, r) for r in range(world)]
    out: list[list[str]] = [[] for _ in range(world)]
    for path, size in sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])):
        load, rank = heapq.heappop(heap)
        out[rank].append(path)
        heapq.heappush(heap, (load + size, rank))
    return [sorted(files) for files in out]


def balance(loads: list[int]) -> float | None:
    """Most bytes on one rank over fewest (1.0 is perfect); None when a rank got nothing."""
    low = min(loads) if loads else 0
    return max(loads) / low if low > 0 else None


@dataclass(slots=True)
class Shard:
    """This rank's place in a distributed restore (a format that restores across ranks gives
    each rank its files: see :attr:`drill.formats.base.Format.restores_across_ranks`)."""

    rank: int
    world: int
    scatter: Callable[[Iterable[Any] | None], Any]
    """Rank 0's items, one per rank (a list, or made as sent): each rank gets its own (its plan,
    not everyone's)."""
    assignment: list[list[str]] = field(default_factory=list)
    """Every rank's files (filled in by the restore)."""


__all__ = ["Shard", "assign", "balance"]
