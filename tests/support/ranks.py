"""Launching ``drill run`` as several ranks, the way srun starts them: one process per rank,
``RANK``/``WORLD_SIZE`` and a ``file://`` rendezvous (nothing listens on a port)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def launch(
    world: int, args: list[str], tmp_path: Path, *, env: dict[str, str] | None = None, timeout: float = 180
) -> list[subprocess.CompletedProcess]:
    """``drill run ARGS`` as ``world`` ranks, each its own process, as srun would start them."""
    rdzv = tmp_path / f"rdzv-{time.monotonic_ns()}"
    rdzv.mkdir()
    procs = start(world, args, rdzv / "store", env=env)
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return results


def start(
    world: int, args: list[str], rdzv: Path, *, env: dict[str, str] | None = None, ranks: range | None = None
) -> list[subprocess.Popen]:
    """``drill run ARGS`` started as ``ranks`` (all of ``world`` by default), meeting in the
    file store ``rdzv``; the caller waits for them."""
    procs = []
    for rank in ranks if ranks is not None else range(world):
        rank_env = {
            **os.environ,
            **(env or {}),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "DRILL_DIST_INIT": f"file://{rdzv}",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "drill", "run", *args],
                env=rank_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
        )
    return procs
