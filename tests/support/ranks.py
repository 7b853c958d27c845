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
    procs = []
    for rank in range(world):
        rank_env = {
            **os.environ,
            **(env or {}),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "DRILL_DIST_INIT": f"file://{rdzv}/store",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "drill", "run", *args],
                env=rank_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return results
