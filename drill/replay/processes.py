"""The replay's processes: one child, or one per rank of a replay by several ranks.

Each child runs :mod:`drill.replay.child` — forked early where that is safe
(:mod:`drill.replay.zygote`), else a fresh interpreter — isolated from the run directory and
the checkpoint, and sends JSON messages on a pipe of its own (the parent never unpickles what a
child sends). A replay by several ranks meets in a ``TCPStore`` this process hosts on
127.0.0.1 (nothing listens elsewhere); when one rank fails, dies or runs out of time, the
others — blocked in a collective for it — are killed with it, and the outcome names the rank.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Protocol

from drill import safe_json
from drill.proc import POLL, child_preexec, python_command, trusted_path
from drill.replay.outcome import DIVERGED, ERROR, PASSED, REFUSED, ReplayOutcome
from drill.replay.zygote import take as take_zygote
from drill.runlog.steplog import StepRecord


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the replay's ranks run: all of them here (``rank`` None: ``ranks`` local processes
    that meet in a store this process hosts on 127.0.0.1), or one — ``rank`` of ``ranks`` — here,
    meeting the others, each started by its own drill rank, in ``store`` under ``prefix`` (a
    distributed drill's rendezvous: ``file:///path`` or ``tcp://host:port``)."""

    ranks: int = 1
    grouped: bool = False
    """In a process group (always for several; for one, a checkpoint several saved)."""
    rank: int | None = None
    store: str | None = None
    prefix: str = ""

    def here(self) -> list[int]:
        return list(range(self.ranks)) if self.rank is None else [self.rank]


class Peers(Protocol):
    """The other ranks of a distributed drill, each running its own rank of the replay (so a
    replay of N ranks spans the hosts the drill's N ranks run on)."""

    size: int
    """Ranks of the drill: the replay spreads over them when it has as many."""
    store: str
    """Where the replay's ranks meet (``file:///path`` or ``tcp://host:port``)."""
    prefix: str

    def start(self, job: dict[str, Any] | None) -> None:
        """Rank 0: what every rank runs — or None, no replay (once; later calls do nothing)."""

    def failed(self) -> str | None:
        """Why another rank's replay ended, if one did."""

    def fail(self, why: str) -> None:
        """Tell the others this rank's replay ended (so theirs stop waiting for it)."""

    def collect(self, part: dict[str, Any]) -> list[dict[str, Any]]:
        """Rank 0: every rank's part, its own first."""


def part_of(outcome: ReplayOutcome, *, secondary: bool = False) -> dict[str, Any]:
    """What one rank's replay tells rank 0 (plain values: it crosses the drill's store)."""
    return {
        "verdict": outcome.verdict, "reason": outcome.reason, "traceback": outcome.traceback, "secondary": secondary,
        "keys_missing": outcome.keys_missing, "keys_untaken": outcome.keys_untaken, "keys_told": outcome.keys_told,
        "rank_steps": {r: [dataclasses.asdict(s) for s in got] for r, got in outcome.rank_steps.items()},
    }  # fmt: skip


PEER_LOST = re.compile(
    r"Connection (reset|closed) by peer|remote process|peer .* (closed|exited)|NCCL.*(abort|remote)", re.I
)
"""What a rank's collective raises when a peer died under it: a consequence, not the cause."""


def merge_parts(outcome: ReplayOutcome, parts: list[dict[str, Any]]) -> None:
    """Rank 0's outcome (its own part first in ``parts``), with every other rank's: their steps,
    their keys, and the failure that caused the others — not a rank stopped because a peer
    failed, nor a collective that broke because a peer died under it, where another rank says why."""
    for part in parts[1:]:
        for rank, got in part["rank_steps"].items():
            outcome.rank_steps[int(rank)] = [StepRecord(**s) for s in got]
        outcome.keys_missing = sorted(set(outcome.keys_missing) | set(part["keys_missing"]))
        if part["keys_told"]:
            outcome.keys_untaken = sorted(set(outcome.keys_untaken) & set(part["keys_untaken"]))
    failed = [p for p in parts if p["verdict"] != PASSED and not p["secondary"]]
    causes = [p for p in failed if not PEER_LOST.search(p["reason"])] or failed
    if causes and causes[0] is not parts[0]:
        cause = causes[0]
        outcome.verdict, outcome.reason, outcome.traceback = cause["verdict"], cause["reason"], cause["traceback"]
        outcome.interrupted = False


@dataclass(slots=True)
class _Child:
    rank: int
    proc: Any
    conn: Connection
    phase: str = "starting"
    steps: int = 0
    done: bool = False


@dataclass(slots=True)
class _World:
    children: list[_Child]
    outcome: ReplayOutcome
    started: float
    grouped: bool
    restored: set[int] = field(default_factory=set)
    untaken: dict[int, set[str]] = field(default_factory=dict)
    provisional: bool = False
    """A rank's collective broke because a peer went away: the failure stands unless that peer
    (still to be heard) says why."""

    def who(self, child: _Child) -> str:
        return f"rank {child.rank}: " if self.outcome.ranks > 1 else ""


def run_children(
    args: list[str],
    *,
    placement: Placement,
    timeout: float,
    started: float,
    untrusted: tuple[str, ...],
    python: str | None = None,
    stop: Callable[[], str | None] | None = None,
) -> ReplayOutcome:
    """Run the replay's processes of ``placement`` here (``args`` as :mod:`drill.replay.child`
    takes them after its pipe) until every one is done, one fails, dies or the ``timeout`` runs
    out — or ``stop`` (asked every second) says why another rank's replay ended it.
    ``python``: a candidate environment's interpreter (a fresh one for every rank)."""
    outcome = ReplayOutcome(verdict=ERROR, reason="", ranks=placement.ranks)
    hosted = _host_store(timeout) if placement.grouped and placement.store is None else None
    store = placement.store or (f"tcp://127.0.0.1:{hosted.port}" if hosted is not None else None)
    world = _World([], outcome, started, placement.grouped)
    try:
        for rank in placement.here():
            where = {
                "rank": rank,
                "size": placement.ranks,
                "store": store,
                "prefix": placement.prefix,
                "timeout": timeout,
            }
            extra = [json.dumps(where)] if placement.grouped else []
            first = rank == placement.here()[0]
            proc, fd = _start_child([*args, *extra], untrusted, zygote=first and python is None, python=python)
            world.children.append(_Child(rank, proc, Connection(fd, writable=False)))
        _listen(world, time.monotonic() + timeout, timeout, int(args[5]), stop)
    except BaseException:
        _kill(world.children)  # interrupted: the children go at once, not after their grace time
        raise
    finally:
        outcome.seconds = time.perf_counter() - started
        _reap(world.children)
        del hosted
    return outcome


def _host_store(timeout: float) -> Any:
    from datetime import timedelta

    import torch.distributed as dist

    return dist.TCPStore(
        "127.0.0.1", 0, None, is_master=True, timeout=timedelta(seconds=timeout), wait_for_workers=False
    )


def _start_child(args: list[str], untrusted: tuple[str, ...], *, zygote: bool, python: str | None) -> tuple[Any, int]:
    """A replay child and the descriptor its messages arrive on."""
    prepared = take_zygote() if zygote else None
    if prepared is not None:
        return prepared.launch(args, trusted_path(untrusted))
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        python_command("drill.replay.child", str(write_fd), *args, untrusted=untrusted, python=python),
        pass_fds=(write_fd,),
        stdin=subprocess.DEVNULL,
        stdout=_stderr_fd(),
        preexec_fn=child_preexec(),
    )
    os.close(write_fd)
    return proc, read_fd


def _listen(world: _World, deadline: float, timeout: float, steps: int, stop: Callable[[], str | None] | None) -> None:
    """Fill the outcome from the children's messages until all are done or one ends it."""
    outcome = world.outcome
    while not all(c.done for c in world.children):
        left = deadline - time.monotonic()
        poll = min(max(left, 0.0), POLL if stop is None else 1.0)
        ready = wait([c.conn for c in world.children if not c.done], poll) if left > 0 else []
        if not ready and time.monotonic() >= deadline:
            slowest = min((c for c in world.children if not c.done), key=lambda c: c.steps)
            outcome.reason = (
                f"replay timed out after {timeout:g} s ({world.who(slowest)}{slowest.phase}, {slowest.steps} of {steps} "
                f"steps done); the {'children were' if len(world.children) > 1 else 'child was'} killed"
            )
            outcome.verdict = ERROR
            _kill(world.children)
            return
        for child in (c for c in world.children if c.conn in ready):
            if not _receive(world, child):
                _kill(world.children)
                return
        if not ready and stop is not None and (why := stop()) is not None:
            outcome.verdict, outcome.reason, outcome.interrupted = ERROR, why, True
            _kill(world.children)
            return
    outcome.verdict = ERROR if world.provisional else PASSED


def _receive(world: _World, child: _Child) -> bool:
    """Take one message from ``child``; False when it ended the replay (failed, refused, died)."""
    outcome = world.outcome
    try:
        kind, *rest = safe_json.loads(child.conn.recv_bytes())
    except EOFError:
        try:
            child.proc.wait(5)
        except subprocess.TimeoutExpired:
            child.proc.kill()
        whose = f" of rank {child.rank}" if world.outcome.ranks > 1 else ""
        outcome.reason = f"the replay process{whose} died ({_exit(child.proc.returncode)}) while {child.phase}"
        return False
    if kind == "restored":
        child.phase = "replaying"
        world.restored.add(child.rank)
        if len(world.restored) == len(world.children):
            outcome.restore_seconds = time.perf_counter() - world.started
    elif kind == "keys":
        return _keys(world, child, rest[0], rest[1])
    elif kind == "step":
        _step(world, child, rest)
    elif kind == "refused":
        outcome.verdict, outcome.reason = REFUSED, rest[0]
        return False
    elif kind == "error":
        reason = f"{world.who(child)}the replay raised while {child.phase}: {rest[0].strip().splitlines()[-1]}"
        if PEER_LOST.search(reason) and any(not c.done for c in world.children if c is not child):
            child.done = True  # a consequence: hear the peer that went away first
            if not world.provisional:
                world.provisional, outcome.traceback, outcome.reason = True, rest[0], reason
            return True
        outcome.traceback, outcome.reason = rest[0], reason
        return False
    elif kind == "done":
        child.done = True
    return True


def _keys(world: _World, child: _Child, missing: list[str], untaken: list[str]) -> bool:
    """How one rank's objects met the checkpoint's keys. A key they ask for and it lacks ends the
    replay (the load fails on it); keys it holds that no rank takes are judged at the end."""
    outcome = world.outcome
    world.untaken[child.rank] = set(untaken)
    outcome.keys_told = True
    if missing:
        outcome.keys_missing = sorted(set(outcome.keys_missing) | set(missing))
        outcome.keys_untaken = sorted(set(untaken))
        outcome.verdict, outcome.reason = DIVERGED, "keys"  # the verdict's words come with the step
        return False
    if len(world.untaken) == len(world.children):
        outcome.keys_untaken = sorted(set.intersection(*world.untaken.values()))
    return True


def _step(world: _World, child: _Child, views: list[Any]) -> None:
    """One step of one rank: alone, the run's view; one of several, its own and the run's."""
    outcome, child.steps = world.outcome, child.steps + 1
    mine = StepRecord(**views[0])
    if not world.grouped:
        outcome.steps.append((None, mine))
    else:
        outcome.rank_steps.setdefault(child.rank, []).append(mine)
        if child.rank == 0 and len(views) > 1 and views[1] is not None:
            outcome.steps.append((None, StepRecord(**views[1])))
    if child.rank == 0 and child.steps == 1:
        outcome.first_step_at = time.perf_counter()


def _kill(children: list[_Child]) -> None:
    for child in children:
        child.proc.kill()


def _reap(children: list[_Child]) -> None:
    for child in children:
        try:
            child.proc.wait(10)
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait()
        child.conn.close()


def _stderr_fd() -> int:
    """The trainer's prints go to our stderr (stdout carries data), or nowhere if it has no fd."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return subprocess.DEVNULL


def _exit(code: int | None) -> str:
    if code is None:
        return "still running"
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"
