"""A sharded checkpoint restored by 1 rank and by 2 ranks, side by side in one run.

    python benchmarks/distributed_restore.py [--workdir DIR] [--repeat 3]

The checkpoint is the project's own: `drill demo --ranks 4 --n-layer 4 --n-embd 1024` (FSDP2 on
4 CPU ranks, one step, ≈ 600 MB in 4 shard files), read once beforehand so both variants run
from the page cache. Each variant is a real `drill run --no-replay` — the 2-rank one as two
processes with a file:// rendezvous, as srun starts them — interleaved, median of --repeat;
the figures are the drills' own records: restore latency, bytes and seconds per rank.
Target: byte balance (max/min bytes per rank) ≤ 1.1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def make_run(work: Path) -> Path:
    run = work / "sharded-run"
    if not run.exists():
        subprocess.run(
            [sys.executable, "-m", "drill", "demo", str(run), "--ranks", "4", "--steps", "1", "--save-every", "1", "--keep", "1",
             "--n-layer", "4", "--n-embd", "1024"],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
    return run


def drill(run: Path, world: int, work: Path) -> dict:
    """One drill with ``world`` ranks; rank 0's outcome document."""
    db = f"sqlite:///{work / 'bench.db'}"
    cmd = [sys.executable, "-m", "drill", "run", "--root", str(run), "--no-replay", "--json", "-q", "--db", db]
    if world == 1:
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        return json.loads(out)
    rdzv = Path(tempfile.mkdtemp(prefix="rdzv-", dir=work))
    procs = [
        subprocess.Popen(cmd, env={**os.environ, "RANK": str(r), "WORLD_SIZE": str(world), "DRILL_DIST_INIT": f"file://{rdzv}/store"},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(world)
    ]  # fmt: skip
    outs = [p.communicate() for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{world}-rank drill failed: {[o[1][-300:] for o in outs]}")
    return json.loads(outs[0][0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="drill-bench-"))
    run = make_run(work)
    ckpt = next(p for p in run.iterdir() if p.is_dir())
    nbytes = sum(p.stat().st_size for p in ckpt.iterdir())
    for p in ckpt.iterdir():  # page cache warm for both
        p.read_bytes()
    docs: dict[int, list[dict]] = {1: [], 2: []}
    for _ in range(args.repeat):
        for world in (1, 2):
            docs[world].append(drill(run, world, work))
    restore = {w: statistics.median(d["timings"]["restore"] for d in docs[w]) for w in docs}
    last = docs[2][-1]["distributed"]
    per_rank = [
        {
            "rank": r["rank"],
            "files": r["files"],
            "bytes": r["bytes"],
            "seconds": r["seconds"],
            "MB/s": round(r["bytes"] / r["seconds"] / 1e6),
        }
        for r in last["ranks"]
    ]
    data = [r["bytes"] for r in last["ranks"]]
    print(json.dumps({
        "checkpoint": {"path": str(ckpt), "bytes": nbytes, "files": len(list(ckpt.glob("*.distcp"))), "saved_by_ranks": 4},
        f"restore seconds (median of {args.repeat})": {"1 rank": round(restore[1], 3), "2 ranks": round(restore[2], 3)},
        "MB/s in total": {"1 rank": round(nbytes / restore[1] / 1e6), "2 ranks": round(nbytes / restore[2] / 1e6)},
        "per rank (last 2-rank drill)": per_rank,
        "ratios": {
            "speed-up, 2 ranks over 1": round(restore[1] / restore[2], 2),
            "byte balance max/min, target <= 1.1": round(max(data) / min(data), 3),
        },
        "slowest rank": last["slowest"],
        "cores on this host": os.cpu_count(),
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
