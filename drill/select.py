"""Which retained checkpoint a drill restores.

Two ways to ask, one answer (a :class:`Choice`, which says how it was chosen):

- a :class:`Selector` — what ``--checkpoint`` accepts: ``latest``, ``oldest``, ``step:N`` or a
  checkpoint path;
- a :class:`Selection` — what a policy's ``selection:`` says: a strategy that never picks a
  checkpoint still being written nor the one keep-last-K retention purges next, and over
  time covers every retained checkpoint (``least-recently-drilled``).

Parsing validates before any I/O; choosing is a pure function of a
:class:`~drill.discover.Discovery` already made.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from drill.checkpoints import CheckpointRef, Discovery, looks_like_checkpoint_name
from drill.errors import NothingToDrill
from drill.units import decimal

FORMS = "latest, oldest, step:N or a checkpoint path"
STRATEGIES = ("latest", "oldest", "random", "least-recently-drilled", "step")


@dataclass(frozen=True, slots=True)
class Selector:
    kind: Literal["latest", "oldest", "step", "path"]
    step: int | None = None
    path: str | None = None

    def __str__(self) -> str:
        if self.kind == "step":
            return f"step:{self.step}"
        if self.kind == "path":
            return str(self.path)
        return self.kind


class SelectionError(ValueError):
    """A selection that cannot be used; ``field`` names the offending key."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(why)
        self.field = field


@dataclass(frozen=True, slots=True, kw_only=True)
class Selection:
    """A policy's ``selection:`` section."""

    strategy: str = "latest"
    """``latest``, ``oldest``, ``random``, ``least-recently-drilled``, or ``step`` (with ``step``)."""
    step: int | None = None
    """For ``step``: the one step to drill."""
    window: float | None = None
    """For ``random``: only checkpoints saved within this many seconds."""
    settle: float = 0.0
    """Skip checkpoints younger than this many seconds (a save may still be in flight)."""
    seed: int | None = None
    """For ``random``: a fixed seed; otherwise one is drawn and recorded."""

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise SelectionError(
                "strategy", f"unknown selection {self.strategy!r} (expected {', '.join(STRATEGIES[:-1])} or step:N)"
            )
        if self.strategy != "step" and self.step is not None:
            raise SelectionError(
                "step", f"sets both step: {self.step} and strategy: {self.strategy}; a fixed step is its own selection"
            )
        if self.strategy == "step" and self.step is None:
            raise SelectionError("strategy", "strategy step needs the step: step: N (or strategy: step:N)")
        if self.step is not None and self.step < 0:
            raise SelectionError("step", f"step {self.step} must be a non-negative integer")
        if self.window is not None and self.strategy != "random":
            raise SelectionError("window", "only random selection takes a window")
        if self.window is not None and self.window <= 0:
            raise SelectionError("window", "must be positive")
        if self.settle < 0:
            raise SelectionError("settle", "must not be negative")

    def __str__(self) -> str:
        return f"step:{self.step}" if self.strategy == "step" else self.strategy


@dataclass(frozen=True, slots=True)
class Choice:
    ref: CheckpointRef
    reason: str
    """How it was chosen, for the record (includes the seed of a random choice)."""
    seed: int | None = None


def parse_selector(text: str) -> Selector:
    """Parse ``latest | oldest | step:N | PATH``; raises ``ValueError`` on anything else."""
    t = text.strip()
    if t in ("latest", "oldest"):
        return Selector(t)  # type: ignore[arg-type]
    if t.startswith("step:"):
        num = t[len("step:") :]
        if (step := decimal(num)) is None:
            raise ValueError(f"{text!r}: step must be a non-negative integer, as in step:1200")
        return Selector("step", step=step)
    if "/" in t or t.startswith(".") or looks_like_checkpoint_name(t) or t.endswith((".pt", ".pth", ".ckpt", ".tar")):
        return Selector("path", path=t)
    if any(c.isdigit() for c in t) and ":" not in t and not t.isspace():
        return Selector("path", path=t)  # a checkpoint's name under the root: epoch_1, ckpt-0042
    raise ValueError(
        f"unknown checkpoint form {text!r}: expected {FORMS} (a directory under --root by its name, as ./{t})"
    )


def _nothing_retained(discovery: Discovery) -> NothingToDrill:
    if discovery.incomplete:
        names = ", ".join(s.name for s in discovery.incomplete)
        return NothingToDrill(
            f"no complete checkpoint under {discovery.root}: only incomplete saves ({names})",
            hint="a save still in progress finishes with its commit marker (.metadata, trainer_state.json); "
            "if none is running, no resume is possible",
        )
    export = f" (only a final model export: {', '.join(discovery.exports)})" if discovery.exports else ""
    return NothingToDrill(
        f"no checkpoint under {discovery.root}{export}",
        hint="point --root at the run directory holding step-N/ or checkpoint-N/ directories, or *.pt/*.ckpt files",
    )


def _retained(discovery: Discovery) -> str:
    named = [str(c.step) if c.step is not None else c.name for c in discovery.checkpoints]
    return ", ".join(named)


def select(discovery: Discovery, selector: Selector) -> Choice:
    """The checkpoint ``selector`` names; raises :class:`NothingToDrill` when there is none."""
    found = discovery.checkpoints
    if not found:
        raise _nothing_retained(discovery)
    if selector.kind == "latest":
        return Choice(found[-1], "latest")
    if selector.kind == "oldest":
        return Choice(found[0], "oldest")
    if selector.kind == "step":
        return Choice(_by_step(discovery, selector.step), f"step:{selector.step}")  # type: ignore[arg-type]
    assert selector.path is not None
    return Choice(_by_path(discovery, selector.path), "path")


def _by_step(discovery: Discovery, step: int) -> CheckpointRef:
    for ref in discovery.checkpoints:
        if ref.step == step:
            return ref
    for inc in discovery.incomplete:
        if inc.step == step:
            raise NothingToDrill(f"step {step} is an incomplete save ({inc.reason}): {inc.uri}")
    stepped = [c for c in discovery.checkpoints if c.step is not None]
    hint = (
        f"drill a retained one: drill run --root {discovery.root} --checkpoint step:{stepped[-1].step}"
        if stepped
        else f"these checkpoints carry no step in their names; name one by path: drill run --checkpoint {discovery.checkpoints[-1].uri}"
    )
    raise NothingToDrill(
        f"no checkpoint for step {step} under {discovery.root} (retained: {_retained(discovery)})", hint=hint
    )


def _by_path(discovery: Discovery, path: str) -> CheckpointRef:
    candidates = [path, os.path.join(discovery.root, path)]

    def same(uri: str) -> bool:
        return any(
            uri.rstrip("/") == c.rstrip("/") or (("://" not in uri) and os.path.realpath(uri) == os.path.realpath(c))
            for c in candidates
        )

    for ref in discovery.checkpoints:
        if same(ref.uri):
            return ref
    for inc in discovery.incomplete:
        if same(inc.uri):
            raise NothingToDrill(f"{inc.uri} is an incomplete save ({inc.reason})")
    raise NothingToDrill(
        f"{path} is not a checkpoint under {discovery.root} (retained: {_retained(discovery) or 'none'})"
    )


def eligible(
    discovery: Discovery, *, now: float, settle: float, keep_last: int | None
) -> tuple[list[CheckpointRef], list[str]]:
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
    """The checkpoint a policy's ``selection`` picks; raises :class:`NothingToDrill` when none qualifies."""
    if not discovery.checkpoints:
        raise _nothing_retained(discovery)
    if selection.strategy == "step":
        assert selection.step is not None
        return Choice(_by_step(discovery, selection.step), f"step {selection.step}, as the policy fixes")
    candidates, skipped = eligible(discovery, now=now, settle=selection.settle, keep_last=keep_last)
    note = f" (skipped {'; '.join(skipped)})" if skipped else ""
    if not candidates:
        raise NothingToDrill(f"no eligible checkpoint under {discovery.root}{note}")
    if selection.strategy == "latest":
        return Choice(candidates[-1], f"latest eligible{note}")
    if selection.strategy == "oldest":
        return Choice(candidates[0], f"oldest eligible{note}")
    if selection.strategy == "random":
        return _random(discovery, selection, candidates, now, seed, note)
    drilled = last_drilled or {}
    never = [r for r in candidates if r.uri not in drilled]
    if never:
        return Choice(never[-1], f"never drilled before{note}")
    ref = min(candidates, key=lambda r: drilled[r.uri])
    return Choice(ref, f"least recently drilled (last {drilled[ref.uri].isoformat()}){note}")


def _random(
    discovery: Discovery, selection: Selection, candidates: list[CheckpointRef], now: float, seed: int | None, note: str
) -> Choice:
    pool = [r for r in candidates if selection.window is None or now - r.mtime <= selection.window]
    if not pool:
        raise NothingToDrill(
            f"no eligible checkpoint saved within the last {selection.window:.0f} s under {discovery.root}"
        )
    seed = (
        selection.seed
        if selection.seed is not None
        else seed
        if seed is not None
        else random.SystemRandom().randrange(2**31)
    )
    return Choice(random.Random(seed).choice(pool), f"random among {len(pool)} with seed {seed}{note}", seed)
