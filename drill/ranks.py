"""Rank numbers a checkpoint names — in its file names (``rng_state_7.pth``), its keys
(``dataloader.dp_rank_7``) and the world size it claims (DeepSpeed's ``dp_world_size``) — are
untrusted numbers. A file named ``rng_state_999999999.pth`` costs what one file costs: the ranks
missing before it are counted, never enumerated, and a world size past any real run's is no
world size at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from drill.findings import PER_CODE, Finding

MAX_WORLD = 1 << 20
"""More ranks than any training run has had (the largest are tens of thousands of GPUs)."""


def plausible_world(claimed: int | None) -> int | None:
    """``claimed`` when a run could have had that many ranks; None (unknown) otherwise."""
    return claimed if claimed is not None and 0 < claimed <= MAX_WORLD else None


def absent(present: Iterable[int], upto: int, limit: int = PER_CODE - 1) -> tuple[list[int], int]:
    """The ranks of ``range(upto)`` not in ``present``: the first ``limit`` of them, and how
    many there are — in time of ``present``'s size, whatever ``upto`` is."""
    have = sorted({r for r in present if 0 <= r < upto})
    listed: list[int] = []
    expect = 0
    for rank in [*have, upto]:
        while expect < rank and len(listed) < limit:
            listed.append(expect)
            expect += 1
        if len(listed) >= limit:
            break
        expect = rank + 1
    return listed, max(upto, 0) - len(have)


def absent_from(expected: Iterable[int], present: Iterable[int], limit: int = PER_CODE - 1) -> tuple[list[int], int]:
    """The ranks of ``expected`` (a world's ranks, listed) not in ``present``, in order: the
    first ``limit`` of them, and how many there are — as :func:`absent` gives them."""
    held = set(present)
    missing = [r for r in expected if r not in held]
    return missing[:limit], len(missing)


def each_missing(missing: tuple[list[int], int], finding: Callable[[int], Finding]) -> list[Finding]:
    """A finding per missing rank listed (``finding(rank)``) and, when :func:`absent` counted
    more than it listed, one that counts the rest — as :func:`drill.findings.bounded` would."""
    listed, total = missing
    return counted([finding(rank) for rank in listed], total)


def counted(findings: list[Finding], total: int) -> list[Finding]:
    """``findings`` (the first of ``total`` alike) and, when there are more, one counting the rest."""
    if not findings or total <= len(findings):
        return findings
    like = findings[-1]
    more = Finding(
        check=like.check,
        code=like.code,
        severity=like.severity,
        message=f"and {total - len(findings)} more {like.code} findings like those above ({total} in all)",
        hint=like.hint,
    )
    return [*findings, more]


__all__ = ["MAX_WORLD", "absent", "absent_from", "counted", "each_missing", "plausible_world"]
