"""The replay's processes: one child, or one per rank of a replay by several ranks.

Each child runs :mod:`drill.replay.child` — forked early where that is safe
(:mod:`drill.replay.zygote`), else a fresh interpreter — isolated from the run directory and
the checkpoint, and sends JSON messages on a pipe of its own (the parent never unpickles what a
child sends). A replay by several ranks meets in a ``TCPStore`` this process hosts on
127.0.0.1 (nothing listens elsewhere); when one rank fails, dies or runs out of time, the
others — blocked in a collective for it — are killed with it, and the outcome names the rank.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from drill import safe_json
from drill.proc import POLL, child_preexec, python_command, trusted_path
from drill.replay.outcome import DIVERGED, ERROR, PASSED, REFUSED, ReplayOutcome
from drill.replay.zygote import take as take_zygote
from drill.runlog.steplog import StepRecord


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

    def who(self, child: _Child) -> str:
        return f"rank {child.rank}: " if len(self.children) > 1 else ""


def run_children(
    args: list[str],
    *,
    ranks: int,
    grouped: bool,
    timeout: float,
    started: float,
    untrusted: tuple[str, ...],
    python: str | None = None,
) -> ReplayOutcome:
    """Run the replay in ``ranks`` processes (``args`` as :mod:`drill.replay.child` takes them
    after its pipe) until every one is done, one fails, dies or the ``timeout`` runs out.
    ``grouped``: in a process group (always for several; for one, a checkpoint several saved).
    ``python``: a candidate environment's interpreter (a fresh one for every rank)."""
    outcome = ReplayOutcome(verdict=ERROR, reason="", ranks=ranks)
    store = _host_store(timeout) if grouped else None
    world = _World([], outcome, started, grouped)
    try:
        for rank in range(ranks):
            extra = (
                []
                if store is None
                else [json.dumps({"rank": rank, "size": ranks, "store": f"127.0.0.1:{store.port}", "timeout": timeout})]
            )
            proc, fd = _start_child([*args, *extra], untrusted, zygote=rank == 0 and python is None, python=python)
            world.children.append(_Child(rank, proc, Connection(fd, writable=False)))
        _listen(world, time.monotonic() + timeout, timeout, int(args[5]))
    except BaseException:
        _kill(world.children)  # interrupted: the children go at once, not after their grace time
        raise
    finally:
        outcome.seconds = time.perf_counter() - started
        _reap(world.children)
        del store
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


def _listen(world: _World, deadline: float, timeout: float, steps: int) -> None:
    """Fill the outcome from the children's messages until all are done or one ends it."""
    outcome = world.outcome
    while not all(c.done for c in world.children):
        left = deadline - time.monotonic()
        ready = wait([c.conn for c in world.children if not c.done], min(max(left, 0.0), POLL)) if left > 0 else []
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
    outcome.verdict = PASSED


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
        whose = f" of rank {child.rank}" if len(world.children) > 1 else ""
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
        outcome.traceback = rest[0]
        outcome.reason = f"{world.who(child)}the replay raised while {child.phase}: {rest[0].strip().splitlines()[-1]}"
        return False
    elif kind == "done":
        child.done = True
    return True


def _keys(world: _World, child: _Child, missing: list[str], untaken: list[str]) -> bool:
    """How one rank's objects met the checkpoint's keys. A key they ask for and it lacks ends the
    replay (the load fails on it); keys it holds that no rank takes are judged at the end."""
    outcome = world.outcome
    world.untaken[child.rank] = set(untaken)
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
