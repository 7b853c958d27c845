"""What the benchmarks share: timing a child process, and the plain-DCP baseline."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

PLAIN_LOAD = r"""
import sys, time, warnings
warnings.simplefilter("ignore")
import torch, torch.distributed.checkpoint as dcp
from drill.safe_pickle import restricted_loads
from drill.formats.dcp_index import skeleton
path = sys.argv[1]
t = time.perf_counter()
md = restricted_loads(open(path + "/.metadata", "rb").read())
sd = {k: v for k, v in skeleton(md, torch.device("cpu")).items() if v is not None}
dcp.load(sd, checkpoint_id=path, no_dist=True, planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
print(time.perf_counter() - t)
"""
"""(a) in both benchmarks: DCP's own reader into targets allocated from the metadata, as a
user's restore allocates its model and optimizer."""


def inner(script: str, arg: str) -> float:
    """Run ``script`` in a fresh interpreter; it prints its own elapsed seconds last."""
    out = subprocess.run([sys.executable, "-c", script, arg], check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
"""As an installed drill runs: with its modules' bytecode cached."""


def outer(cmd: list[str] | str, env: dict[str, str] | None = None) -> float:
    """Wall-clock seconds of a whole process (a string runs through the shell)."""
    t = time.perf_counter()
    subprocess.run(
        cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, shell=isinstance(cmd, str)
    )
    return time.perf_counter() - t


def cores() -> int:
    """The cores this process may run on: what a limit or a peer at its best uses."""
    return len(os.sched_getaffinity(0))


def outer_cpu(cmds: list[list[str]]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system, every process) of ``cmds`` run side by side."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for c in cmds]
    if any(p.wait() != 0 for p in procs):
        raise subprocess.CalledProcessError(1, cmds[0])
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def shares(files: list[str], n: int) -> list[list[str]]:
    """``files`` dealt into at most ``n`` lists of about equal bytes, biggest first: how
    several processes of a one-file-at-a-time tool split a checkpoint between them."""
    out: list[tuple[int, list[str]]] = [(0, []) for _ in range(max(1, min(n, len(files))))]
    for f in sorted(files, key=os.path.getsize, reverse=True):
        out.sort(key=lambda s: s[0])
        size, names = out[0]
        out[0] = (size + os.path.getsize(f), [*names, f])
    return [names for _, names in out if names]


def warm(path: Path) -> None:
    """Read every file under ``path`` once, so that what follows runs from the page cache."""
    for p in path.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(1 << 24):
                    pass
