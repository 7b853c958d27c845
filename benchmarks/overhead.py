"""What a drill costs: fixed overhead per drill, and restore throughput on a ≥1 GB checkpoint.

    python benchmarks/overhead.py [--workdir DIR] [--repeat 5]

Each measurement runs in a fresh process, side by side with its baseline:
  (1) `drill run --checkpoint latest` on the default demo run (with and without its replay)
      vs  `python -c "import torch"`;
  (2) drill's restore (read + hash + load) of a 1.06 GB demo checkpoint  vs  a plain
      `torch.distributed.checkpoint.load` of it into preallocated tensors.
The checkpoint files are read once beforehand so both sides run from the page cache.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PLAIN_LOAD, inner, outer

DRILL_RESTORE = r"""
import sys, time, torch
from drill.discover import discover
from drill.formats import restore
import drill.formats.dcp_read  # imported before the clock, as the baseline imports DCP
from drill.storage import LocalStorage
storage = LocalStorage()
ref = discover(storage, sys.argv[1]).checkpoints[-1]
t = time.perf_counter()
r = restore(storage, ref, torch.device("cpu"))
assert not r.failures and r.metadata_error is None
print(time.perf_counter() - t)
"""


def warm(path: Path) -> int:
    total = 0
    for f in path.iterdir():
        with open(f, "rb") as fh:
            while chunk := fh.read(64 << 20):
                total += len(chunk)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=None, help="where to write the demo runs (default: a temp dir)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="drill-bench-"))
    env = {**os.environ, "DRILL_DATABASE_URL": f"sqlite:///{work / 'bench.db'}"}
    drill = [sys.executable, "-m", "drill"]

    small, big = work / "small-run", work / "big-run"
    if not small.exists():
        subprocess.run([*drill, "demo", str(small)], check=True, env=env, stdout=subprocess.DEVNULL)
    if not big.exists():
        subprocess.run(
            [
                *drill,
                "demo",
                str(big),
                "--steps",
                "2",
                "--save-every",
                "2",
                "--keep",
                "1",
                "--n-layer",
                "7",
                "--n-embd",
                "1024",
            ],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
        )

    torch_import, drill_run, drill_restore_only = [], [], []
    for _ in range(args.repeat):  # interleaved, so drift in the machine hits every variant alike
        torch_import.append(outer([sys.executable, "-c", "import torch"]))
        drill_run.append(outer([*drill, "run", "--root", str(small), "--checkpoint", "latest"], env))
        drill_restore_only.append(
            outer([*drill, "run", "--root", str(small), "--checkpoint", "latest", "--no-replay"], env)
        )
    t_import, t_run, t_noreplay = (statistics.median(x) for x in (torch_import, drill_run, drill_restore_only))

    ckpt = big / "step-2"
    nbytes = warm(ckpt)
    plain, ours = [], []
    for _ in range(args.repeat):  # interleaved, so drift in the machine hits both sides alike
        plain.append(inner(PLAIN_LOAD, str(ckpt)))
        ours.append(inner(DRILL_RESTORE, str(big)))
    t_plain, t_ours = statistics.median(plain), statistics.median(ours)

    result = {
        "fixed_overhead": {
            "python -c 'import torch' s": round(t_import, 3),
            "drill run --checkpoint latest s (with its 5-step replay)": round(t_run, 3),
            "drill run --checkpoint latest --no-replay s": round(t_noreplay, 3),
            "ratio": round(t_run / t_import, 2),
            "ratio --no-replay": round(t_noreplay / t_import, 2),
        },
        "restore": {
            "checkpoint bytes": nbytes,
            "plain dcp.load s": round(t_plain, 3),
            "drill restore (read + xxh3 + load) s": round(t_ours, 3),
            "drill GB/s": round(nbytes / t_ours / 1e9, 2),
            "plain GB/s": round(nbytes / t_plain / 1e9, 2),
            "ratio drill/plain": round(t_ours / t_plain, 2),
        },
        "median of": args.repeat,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
