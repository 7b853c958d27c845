"""The trainer's resume: drill.sdk.load against the ways a checkpoint gets into memory today.

    python benchmarks/resume.py CHECKPOINT_DIR [--repeat 5] [--device cpu|cuda] [--json]

CHECKPOINT_DIR is a sealed single-rank DCP checkpoint (e.g. the step-1 of
``drill demo RUN --steps 1 --save-every 1 --n-layer 8 --n-embd 1024``, 1.21 GB). Each way runs
in a fresh process, page cache warm (every file is read once first), median of --repeat:

  (a) dcp.load, FileSystemReader, into targets allocated from the metadata   (the baseline)
  (b) drill.sdk.load into the same targets: read once, hashed, compared with the seal
  (c) torch.load(mmap=True) of the same state saved as one torch.save file, copied into targets

The limit a verified load is held to — every byte read straight into its target and hashed
as it lands — is ``benchmarks/limit.py``'s (on the CPU); this one measures the ways side by
side on a GPU too.

With --device cuda every way fills targets allocated on the GPU (drill through its pinned
ring and side stream, the others as they would) and the clock stops after a synchronize; the
target there is drill.sdk.load ≤ 0.5× dcp.load. It prints each way's median seconds and peak
RSS, and the ratios the README quotes:
sdk/dcp.load, and (from `drill run --json` on a run holding the checkpoint) the
checks' share of the restore; plus start-up: `drill run --no-replay` on the tiny default demo
vs `python -c "import torch"`, and `drill verify` vs `xxhsum -H2` (when installed) on it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import warm

PRELUDE = r"""
import sys, time, resource, warnings, json
warnings.simplefilter("ignore")
import torch
torch.set_num_threads(2)
from drill.safe_pickle import restricted_loads
from drill.formats.dcp_index import skeleton
path = sys.argv[1]
DEVICE = torch.device(sys.argv[3])
def targets():
    md = restricted_loads(open(path + "/.metadata", "rb").read())
    return md, {k: v for k, v in skeleton(md, DEVICE).items() if v is not None}
def done(t):
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)
    print(json.dumps({"seconds": time.perf_counter() - t, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""

WAYS = {
    "dcp.load": r"""
import torch.distributed.checkpoint as dcp
t = time.perf_counter()
md, sd = targets()
dcp.load(sd, checkpoint_id=path, no_dist=True, planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
done(t)
""",
    "drill.sdk.load": r"""
import drill.sdk, drill.sdk.verified_load, torch.distributed.checkpoint
t = time.perf_counter()
md, sd = targets()
report = drill.sdk.load(sd, path, record=False)
assert report.sealed and report.verified_files > 0
done(t)
""",
    "torch.load(mmap)": r"""
t = time.perf_counter()
md, sd = targets()
loaded = torch.load(sys.argv[2], mmap=True, weights_only=True)
for k, v in loaded.items():
    if k in sd:
        sd[k].copy_(v)
done(t)
""",
}


def run_way(name: str, ckpt: Path, single: Path, device: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", PRELUDE + WAYS[name], str(ckpt), str(single), device],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def wall(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def consolidated(ckpt: Path, into: Path) -> Path:
    """The checkpoint's tensors as one torch.save file, for torch.load(mmap=True)."""
    code = (
        PRELUDE
        + r"""
import torch.distributed.checkpoint as dcp
md, sd = targets()
dcp.load(sd, checkpoint_id=path, no_dist=True, planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
torch.save(sd, sys.argv[2])
"""
    )
    subprocess.run([sys.executable, "-c", code, str(ckpt), str(into), "cpu"], check=True, capture_output=True)
    return into


def restore_and_checks(ckpt: Path, work: Path, device: str) -> dict[str, float]:
    """`drill run --no-replay` on a run holding ``ckpt``: the checks' share of the restore."""
    run = work / "run"
    run.mkdir()
    os.symlink(ckpt, run / ckpt.name)
    doc = json.loads(
        subprocess.run(
            [
                "drill",
                "run",
                "--root",
                str(run),
                "--no-replay",
                "--json",
                "--device",
                device,
                "--db",
                f"sqlite:///{work}/d.db",
            ],
            capture_output=True,
            text=True,
        ).stdout
    )
    timings = doc["timings"]
    return {"restore": timings["restore"], "checks": timings["checks"], "share": timings["checks"] / timings["restore"]}


def startup(work: Path, repeat: int) -> dict[str, float]:
    demo = work / "tiny"
    subprocess.run(["drill", "demo", str(demo)], check=True, capture_output=True)
    db = f"sqlite:///{work}/s.db"
    torch_s = statistics.median(wall([sys.executable, "-c", "import torch"]) for _ in range(repeat))
    run_s = statistics.median(
        wall(["drill", "run", "--root", str(demo), "--no-replay", "--db", db]) for _ in range(repeat)
    )
    return {"import torch": torch_s, "drill run --no-replay": run_s, "ratio": run_s / torch_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--device", default="cpu", help="where the targets live: cpu (default) or cuda[:N]")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    ckpt = args.checkpoint.resolve()
    with tempfile.TemporaryDirectory(prefix="drill-resume-bench-") as tmp:
        work = Path(tmp)
        single = consolidated(ckpt, work / "state.pt")
        warm(ckpt)
        warm(single)
        ways: dict[str, dict[str, float]] = {}
        for _ in range(args.repeat):  # interleaved, so drift hits every way alike
            for name in WAYS:
                for k, v in run_way(name, ckpt, single, args.device).items():
                    ways.setdefault(name, {}).setdefault(k, []).append(v)
        med = {name: {k: statistics.median(v) for k, v in got.items()} for name, got in ways.items()}
        size = sum(p.stat().st_size for p in ckpt.iterdir() if p.is_file())
        figures = {
            "checkpoint_bytes": size,
            "ways": med,
            "sdk/dcp.load": med["drill.sdk.load"]["seconds"] / med["dcp.load"]["seconds"],
            "device": args.device,
            "checks": restore_and_checks(ckpt, work, args.device),
            "startup": startup(work, args.repeat),
        }
        if shutil.which("xxhsum"):
            figures["verify"] = {
                "drill verify": statistics.median(
                    wall(["drill", "verify", str(ckpt), "--db", f"sqlite:///{work}/v.db"]) for _ in range(args.repeat)
                ),
                "xxhsum -H2": statistics.median(
                    wall(["sh", "-c", f"xxhsum -H2 {ckpt}/* > /dev/null"]) for _ in range(args.repeat)
                ),
            }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(
        f"checkpoint {size / 1e9:.2f} GB onto {args.device}, median of {args.repeat}, fresh processes, page cache warm"
    )
    for name, m in med.items():
        print(f"  {name:<20} {m['seconds']:7.3f} s   peak RSS {m['rss'] / 1e9:5.2f} GB")
    print(f"  drill.sdk.load / dcp.load = {figures['sdk/dcp.load']:.2f}")
    c = figures["checks"]
    print(f"  drill run: checks {c['checks']:.3f} s on a restore of {c['restore']:.3f} s (share {c['share']:.2f})")
    s = figures["startup"]
    print(
        f"  start-up: drill run --no-replay {s['drill run --no-replay']:.2f} s vs import torch {s['import torch']:.2f} s (ratio {s['ratio']:.2f})"
    )
    if "verify" in figures:
        v = figures["verify"]
        print(f"  drill verify {v['drill verify']:.2f} s vs xxhsum -H2 {v['xxhsum -H2']:.2f} s")


if __name__ == "__main__":
    main()
