"""Which retained checkpoint a scheduled drill restores: a pure function of what is there.

Never a checkpoint still being written (incomplete saves are not candidates; temp names and
saves younger than the settle time are skipped), never the one keep-last-K retention will
purge next, and over time every retained checkpoint (``least-recently-drilled``).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from drill.discover import CheckpointRef, Discovery
from drill.errors import NothingToDrill
from drill.policy.model import Selection


@dataclass(frozen=True, slots=True)
class Choice:
    ref: CheckpointRef
    reason: str
    """How it was chosen, for the record (includes the seed of a random choice)."""
    seed: int | None = None


def eligible(discovery: Discovery, *, now: float, settle: float, keep_last: int | None) -> tuple[list[CheckpointRef], list[str]]:
    """Candidates oldest first, and why each excluded one was excluded."""
    skipped: list[str] = []
    candidates = []
    for ref in discovery.checkpoints:
        if ref.name.startswith(".") or ref.name.endswith((".tmp", ".partial", ".inprogress")):
            skipped.append(f"{ref.name}: a temporary name")
        elif now - ref.mtime < settle:
            skipped.append(f"{ref.name}: saved {now - ref.mtime:.0f} s ago, inside the {settle:.0f} s settle time")
        else:
            candidates.append(ref)
    if keep_last is not None and len(candidates) >= keep_last and len(candidates) > 1:
        # The next save makes retention delete the oldest of the last K: a drill started on it
        # now may lose its files mid-restore, and proves nothing about what stays.
        doomed = candidates[: len(candidates) - keep_last + 1]
        skipped += [f"{r.name}: keep-last-{keep_last} retention purges it next" for r in doomed]
        candidates = candidates[len(doomed) :]
    return candidates, skipped


def choose(
    discovery: Discovery,
    selection: Selection,
    *,
    now: float,
    keep_last: int | None = None,
    last_drilled: Mapping[str, datetime] | None = None,
    seed: int | None = None,
) -> Choice:
    """The checkpoint ``selection`` picks; raises :class:`NothingToDrill` when none qualifies."""
    candidates, skipped = eligible(discovery, now=now, settle=selection.settle, keep_last=keep_last)
    note = f" (skipped {'; '.join(skipped)})" if skipped else ""
    if selection.strategy == "step":
        for ref in discovery.checkpoints:
            if ref.step == selection.step:
                return Choice(ref, f"step {selection.step}, as the policy fixes")
        raise NothingToDrill(f"the policy's step {selection.step} is not a complete checkpoint under {discovery.root}")
    if not candidates:
        raise NothingToDrill(f"no eligible checkpoint under {discovery.root}{note}")
    if selection.strategy == "latest":
        return Choice(candidates[-1], f"latest eligible{note}")
    if selection.strategy == "oldest":
        return Choice(candidates[0], f"oldest eligible{note}")
    if selection.strategy == "random":
        pool = [r for r in candidates if selection.window is None or now - r.mtime <= selection.window]
        if not pool:
            raise NothingToDrill(f"no eligible checkpoint saved within the last {selection.window:.0f} s under {discovery.root}")
        seed = selection.seed if selection.seed is not None else seed if seed is not None else random.SystemRandom().randrange(2**31)
        ref = random.Random(seed).choice(pool)
        return Choice(ref, f"random among {len(pool)} with seed {seed}{note}", seed)
    assert selection.strategy == "least-recently-drilled"
    drilled = last_drilled or {}
    never = [r for r in candidates if r.uri not in drilled]
    if never:
        return Choice(never[-1], f"never drilled before{note}")
    ref = min(candidates, key=lambda r: drilled[r.uri])
    return Choice(ref, f"least recently drilled (last {drilled[ref.uri].isoformat()}){note}")
