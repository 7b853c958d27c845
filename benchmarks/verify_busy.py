"""``drill verify`` against ``xxhsum -H2`` as whole processes, with every core idle and with
another process holding one core.

    python benchmarks/verify_busy.py [--sizes 1.2,4.8] [--repeat 7] [--json]

For each size it writes a sealed single-rank DCP checkpoint (``drill.sdk.save``, 24 tensors),
warms the page cache and times, interleaved round by round, median of --repeat: ``drill verify
CKPT`` (the console script: start-up, listing, the seal, hashing on the cores it finds free,
the coverage ledger, the verdict) and ``xxhsum -H2`` over the same files; first idle, then
while a busy loop (``python -c "while True: pass"``) holds one core. Targets: ratio ≤ 1.0 idle,
≤ 1.2 with a core held.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ENV, outer
from limit import WRITE


def wall(cmd: list[str] | str) -> float:
    return outer(cmd, ENV)


def rounds(ckpt: Path, db: str, repeat: int) -> dict[str, float]:
    files = " ".join(str(p) for p in sorted(ckpt.iterdir()) if p.is_file()) + f" {ckpt}/.metadata"
    got: dict[str, list[float]] = {"drill verify": [], "xxhsum -H2": []}
    for _ in range(repeat):
        got["drill verify"].append(wall(["drill", "verify", str(ckpt), "--db", db]))
        got["xxhsum -H2"].append(wall(f"xxhsum -H2 {files}"))
    med = {k: statistics.median(v) for k, v in got.items()}
    return {**med, "ratio": med["drill verify"] / med["xxhsum -H2"]}


def measure(gigabytes: float, repeat: int, work: Path) -> dict:
    subprocess.run(
        [sys.executable, "-c", WRITE, str(work), str(gigabytes), "--no-extras"],
        check=True,
        capture_output=True,
        env=ENV,
    )
    ckpt, db = work / "ckpt", f"sqlite:///{work}/v.db"
    subprocess.run(f"cat {ckpt}/* > /dev/null", shell=True, check=True)
    wall(["drill", "verify", str(ckpt), "--db", db])  # warm-up: bytecode, the ledger's first rows
    out = {"bytes": sum(p.stat().st_size for p in ckpt.iterdir()), "idle": rounds(ckpt, db, repeat)}
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.0)  # the spinner is in its loop: a core held, as drill sees it (its run queue)
        out["one core held"] = rounds(ckpt, db, repeat)
    finally:
        spinner.kill()
        spinner.wait()
    shutil.rmtree(ckpt)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1.2,4.8")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not shutil.which("xxhsum"):
        raise SystemExit("xxhsum is not installed (Debian: apt-get install xxhash)")
    figures = {}
    for size in args.sizes.split(","):
        with tempfile.TemporaryDirectory(prefix="drill-verify-") as tmp:
            figures[size] = measure(float(size), args.repeat, Path(tmp))
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for f in figures.values():
        print(f"{f['bytes'] / 1e9:.2f} GB, median of {args.repeat}, whole processes, page cache warm")
        for state in ("idle", "one core held"):
            r = f[state]
            print(
                f"  {state:<14} drill verify {r['drill verify']:.3f} s  xxhsum -H2 {r['xxhsum -H2']:.3f} s  ratio {r['ratio']:.2f}"
            )


if __name__ == "__main__":
    main()
