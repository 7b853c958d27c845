"""Sealing at save against saving plain: what the seal adds to a checkpoint save.

    python benchmarks/sealed_save.py [--gib 1.0] [--repeat 5] [--sync] [--dir DIR] [--json]

Each way saves the same ~1 GiB state (16 float32 tensors, as a model's and optimizer's) with
DCP in a fresh process, into a fresh directory; rounds are interleaved (a, b, c, d, e, a, …)
and each way's median wall and CPU seconds (user + system, every thread of the saving
process: steadier than wall time on a shared machine) are reported, with the ratios:

  (a) plain ``dcp.save`` (FileSystemWriter)                          the baseline
  (b) ``drill.sdk.save``: the same save through SealingWriter       sealed / plain (target ≤ 1.05)
  (c) plain ``dcp.save``, then ``drill seal`` of the directory      what sealing at save removes
  (d) plain ``dcp.async_save``: seconds until it returns (blocking), and until the save is done
  (e) ``drill.sdk.async_save``: the same                            blocking sealed / plain (≤ 1.05)

and the bytes each way read back during the save (``rchar`` of /proc/self/io: every read
system call, page cache included): the sealing path's is the interpreter's own small reads,
against the whole checkpoint for (c). ``sync_files`` is off by default (the save lands in the
page cache: the hardest case for the ratio, since nothing else is slow); ``--sync`` fsyncs as
DCP does by default. Before each round the previous round's dirty pages are written back
(``sync``), outside the clock, so no round pays for another's writeback.
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
from pathlib import Path

PRELUDE = r"""
import sys, time, json, warnings
warnings.simplefilter("ignore")
import torch
torch.set_num_threads(2)
import torch.distributed.checkpoint as dcp
from drill.sdk import async_save, save, seal  # imported by every way, before any clock or counter starts
path, gib, sync = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1"
n = 16
numel = int(gib * (1 << 30) / 4 / n)
state = {"model": {f"layer{i}.weight": torch.full((numel,), float(i)) for i in range(n // 2)},
         "optimizer": {f"exp_avg{i}": torch.full((numel,), -float(i)) for i in range(n // 2)}}
def rchar():
    for line in open("/proc/self/io"):
        if line.startswith("rchar:"):
            return int(line.split()[1])
import resource
def cpu():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime
def out(**kw):
    print(json.dumps({"cpu": cpu() - c0, **kw}))
r0, c0 = rchar(), cpu()
"""

WAYS = {
    "plain": r"""
t = time.perf_counter()
dcp.save(state, checkpoint_id=path, storage_writer=dcp.FileSystemWriter(path, sync_files=sync), no_dist=True)
out(seconds=time.perf_counter() - t, read_back=rchar() - r0)
""",
    "sealed": r"""
t = time.perf_counter()
report = save(state, path, no_dist=True, sync_files=sync)
out(seconds=time.perf_counter() - t, read_back=rchar() - r0, hash_seconds=report.hash_seconds, reported_read_back=report.bytes_read_back)
""",
    "plain+seal": r"""
t = time.perf_counter()
dcp.save(state, checkpoint_id=path, storage_writer=dcp.FileSystemWriter(path, sync_files=sync), no_dist=True)
saved = time.perf_counter() - t
r1 = rchar()
seal(path)
out(seconds=time.perf_counter() - t, save_seconds=saved, read_back=rchar() - r1)
""",
    "async plain": r"""
t = time.perf_counter()
f = dcp.async_save(state, checkpoint_id=path, storage_writer=dcp.FileSystemWriter(path, sync_files=sync), no_dist=True)
blocking = time.perf_counter() - t
f.result()
out(seconds=time.perf_counter() - t, blocking=blocking, read_back=rchar() - r0)
""",
    "async sealed": r"""
t = time.perf_counter()
f = async_save(state, path, no_dist=True, sync_files=sync)
blocking = time.perf_counter() - t
f.result()
out(seconds=time.perf_counter() - t, blocking=blocking, read_back=rchar() - r0)
""",
}


def once(way: str, gib: float, sync: bool, scratch: Path) -> dict[str, float]:
    target = scratch / "step-1"
    shutil.rmtree(target, ignore_errors=True)
    os.sync()  # the previous round's dirty pages written back first: no round pays for another's writeback
    res = subprocess.run(
        [sys.executable, "-c", PRELUDE + WAYS[way], str(target), str(gib), "1" if sync else "0"],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--sync", action="store_true", help="fsync every file, as DCP does by default")
    ap.add_argument(
        "--dir", help="where to save (default: a temporary directory; /dev/shm takes the disk out of the measure)"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {w: [] for w in WAYS}
    with tempfile.TemporaryDirectory(prefix="drill-bench-", dir=args.dir) as tmp:
        for _ in range(args.repeat):
            for way in WAYS:
                runs[way].append(once(way, args.gib, args.sync, Path(tmp)))

    def med(way: str, key: str = "seconds") -> float:
        return statistics.median(r[key] for r in runs[way])

    result = {
        "gib": args.gib, "repeat": args.repeat, "sync_files": args.sync,
        "seconds": {w: med(w) for w in WAYS},
        "cpu_seconds": {w: med(w, "cpu") for w in WAYS},
        "sealed/plain": med("sealed") / med("plain"),
        "cpu sealed/plain": med("sealed", "cpu") / med("plain", "cpu"),
        "cpu plain+seal/plain": med("plain+seal", "cpu") / med("plain", "cpu"),
        "plain+seal/plain": med("plain+seal") / med("plain"),
        "async blocking sealed/plain": med("async sealed", "blocking") / med("async plain", "blocking"),
        "async total sealed/plain": med("async sealed") / med("async plain"),
        "hash_seconds (sealed, summed over writer threads)": med("sealed", "hash_seconds"),
        "bytes read back": {w: int(med(w, "read_back")) for w in WAYS},
        "bytes the seal reported reading back": int(med("sealed", "reported_read_back")),
    }  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(
        f"{args.gib:g} GiB state, {args.repeat} interleaved rounds, fresh processes, sync_files={args.sync}; medians:"
    )
    for way in WAYS:
        extra = f" (blocking {med(way, 'blocking'):.3f} s)" if "async" in way else ""
        print(
            f"  {way:14s} {med(way):7.3f} s wall, {med(way, 'cpu'):6.3f} CPU-s{extra}   read back {int(med(way, 'read_back')):>14,} bytes"
        )
    for key in (
        "sealed/plain",
        "cpu sealed/plain",
        "plain+seal/plain",
        "cpu plain+seal/plain",
        "async blocking sealed/plain",
        "async total sealed/plain",
    ):
        print(f"  {key:30s} {result[key]:.3f}")
    print(
        f"  the sealing writer hashed for {result['hash_seconds (sealed, summed over writer threads)']:.3f} s and reported {result['bytes the seal reported reading back']} bytes read back"
    )


if __name__ == "__main__":
    main()
