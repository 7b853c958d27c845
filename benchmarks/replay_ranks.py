"""Time to the first replayed step on 2 ranks, against the restore alone and the bare resume.

    python benchmarks/replay_ranks.py [--n-layer 4] [--n-embd 512] [--repeat 3] [--json]

Trains the FSDP2 demo on 2 ranks (CPU, gloo) into a scratch directory, then, page cache warm
(every file read once first), each way in fresh processes, median of --repeat, whole-process
wall clock from spawn to exit:

  (a) restore alone: ``drill run --no-replay`` — read, hash, load, check, record
  (b) the bare resume: 2 processes that join a process group, build the run's FSDP2 objects,
      ``dcp.load`` the checkpoint into them and take one step — what the trainer itself pays
      to get back to training, with nothing verified
  (c) the drill with its replay: ``drill run --replay-steps 1`` — (a), then 2 replay ranks
      that load the checkpoint into the objects and take one step, compared with the run

It prints each way's median and the ratios: (c)/(a), what the replay adds to a restore drill,
and (c)/((a)+(b)), the drill against doing its two halves by hand one after the other (≤ 1:
the replay's processes start while the drill restores — the zygote is forked before — and
share the warm cache). Also drill's own ``ttfs`` (drill start → first replayed step, inside
the drill process) next to (b).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ENV, warm

BARE_RESUME = r"""
import os, sys, time, warnings
warnings.simplefilter("ignore")
import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
from drill.demo.config import DemoConfig
from drill.demo.distributed import objects, stateful, step
run, ckpt, rdzv = sys.argv[1:4]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method=f"file://{rdzv}", rank=rank, world_size=world)
torch.set_num_threads(1)
o = objects(DemoConfig.read(run), rank, world)
dcp.load(stateful(o, rank), checkpoint_id=ckpt)
step(o, rank, world)
dist.barrier()
dist.destroy_process_group()
"""


def bare_resume(run: Path, ckpt: Path, scratch: Path) -> float:
    rdzv = scratch / f"rdzv-{time.monotonic_ns()}"
    t = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BARE_RESUME, str(run), str(ckpt), str(rdzv)],
            env={**ENV, "RANK": str(r), "WORLD_SIZE": "2"},
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        for r in range(2)
    ]
    if any(p.wait() != 0 for p in procs):
        raise SystemExit("the bare resume failed")
    return time.perf_counter() - t


def drill_run(run: Path, db: str, *args: str) -> tuple[float, dict]:
    t = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "drill", "run", "--root", str(run), "--checkpoint", "step:2", "--db", db, "--json", "-q", *args],
        capture_output=True, text=True, env=ENV,
    )  # fmt: skip
    seconds = time.perf_counter() - t
    doc = json.loads(res.stdout)
    if doc["status"] != "passed":
        raise SystemExit(f"the drill did not pass: {doc.get('message')}")
    return seconds, doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from drill.demo.config import DemoConfig
    from drill.demo.distributed import train_distributed

    with tempfile.TemporaryDirectory(prefix="drill-bench-replay-") as tmp:
        scratch = Path(tmp)
        run = scratch / "run"
        cfg = DemoConfig(steps=4, save_every=2, keep=2, n_layer=args.n_layer, n_embd=args.n_embd)
        train_distributed(run, cfg, 2)
        ckpt = run / "step-2"
        size = sum(p.stat().st_size for p in ckpt.iterdir())
        db = f"sqlite:///{scratch / 'drill.db'}"
        warm(run)
        restore, bare, full, ttfs = [], [], [], []
        for _ in range(args.repeat):  # interleaved: a slower minute slows every way alike
            restore.append(drill_run(run, db, "--no-replay")[0])
            bare.append(bare_resume(run, ckpt, scratch))
            seconds, doc = drill_run(run, db, "--replay-steps", "1")
            assert doc["replay"]["verdict"] == "passed", doc["replay"]
            full.append(seconds)
            ttfs.append(doc["timings"]["ttfs"])
    a, b, c, t = (statistics.median(x) for x in (restore, bare, full, ttfs))
    result = {
        "checkpoint_bytes": size, "cpus": os.cpu_count(), "restore_alone_s": a, "bare_resume_s": b,
        "drill_with_replay_s": c, "drill_ttfs_s": t, "replay_over_restore": c / a, "drill_over_both_by_hand": c / (a + b),
    }  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"checkpoint: {size / 1e6:.1f} MB saved by 2 ranks (FSDP2, CPU); {os.cpu_count()} CPUs; median of {args.repeat}"
    )
    print(f"(a) restore alone (drill run --no-replay)          {a:6.2f} s")
    print(f"(b) bare 2-rank resume to its first step           {b:6.2f} s")
    print(f"(c) drill run + 2-rank replay, first step compared {c:6.2f} s   (drill's ttfs {t:.2f} s)")
    print(f"(c)/(a) = {c / a:.2f}   what the replay adds to a restore drill")
    print(f"(c)/((a)+(b)) = {c / (a + b):.2f}   the drill against its two halves done by hand, one after the other")


if __name__ == "__main__":
    main()
