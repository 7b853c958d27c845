"""Verification cost, side by side with its baselines, on a sealed ≥1 GiB checkpoint.

    python benchmarks/verify.py [--workdir DIR] [--repeat 5] [--n-layer 8 --n-embd 1024]

The checkpoint is made by the project's own training code (`drill demo --n-layer 8
--n-embd 1024`: 1.2 GB, sealed as it is saved) and read once beforehand so every variant
runs from the page cache. Each variant runs in a fresh process, interleaved, median of
--repeat runs:

  (a) plain torch.distributed.checkpoint.load, targets allocated from the metadata as a
      user's restore allocates its model and optimizer;
  (b) drill's verified restore: the same load, every byte hashed and compared with the
      manifest in the same read;
  (c) drill's verify-only (`drill verify`), no tensors loaded;
  (d) `xxhsum -H2` (xxh128, the xxHash reference CLI) over the same files, at its best: one
      process per core this run may use, the files dealt between them by size (xxhsum hashes
      one file at a time);
  (e) Python hashlib.sha256 streaming over them in 1 MiB reads, one thread per core over the
      files (hashlib lets the GIL go while it hashes): what SHA-256 manifests such as
      Megatron's integrity.json cost at their best;
  (f) the command itself, `drill verify CKPT --db FILE` (the console script): argument
      parsing, the coverage ledger read and written, the verdict rendered. Unlike (c), a
      library call, the command hashes local files through mappings in forked workers
      (drill.integrity.mapped).

(a), (b), (c) and (e) report the time inside the process (imports excluded); (c), (d) and
(f) are also timed as whole processes, the only way to time xxhsum, with their CPU seconds
(every process's user + system) beside the wall clock. A bigger checkpoint
(--n-embd 2048: 4.6 GB) shows where start-up stops mattering.
Targets: (b)/(a) ≤ 1.10; (c) and (f) no slower than (d); (e)/(c) ≥ 5.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PLAIN_LOAD, cores, inner, outer_cpu, shares

VERIFIED_RESTORE = r"""
import sys, time, torch
from drill.discover import discover
from drill.integrity.sampling import SampleSpec
from drill.integrity.verify import Observed, integrity_check, plan_integrity
from drill.formats import restore
import drill.formats.dcp_read  # imported before the clock, as the baseline imports DCP
from drill.storage import LocalStorage
storage = LocalStorage()
ref = discover(storage, sys.argv[1]).checkpoints[-1]
t = time.perf_counter()
plan = plan_integrity(storage, ref.uri, SampleSpec("all"))
r = restore(storage, ref, torch.device("cpu"), hash_plan=plan.hash_plan)
observed = {f.relative_path: Observed(hashes=f.hashes) for f in r.files}
check = integrity_check(plan, observed)
elapsed = time.perf_counter() - t
assert not r.failures and not check.findings and check.evidence["bytes_verified"] == check.evidence["bytes_listed"]
print(elapsed)
"""

VERIFY_ONLY = r"""
import sys, time
from drill.verifier import verify_checkpoint
t = time.perf_counter()
o = verify_checkpoint(sys.argv[1])
elapsed = time.perf_counter() - t
assert not o.result.findings, o.result.findings
print(elapsed)
"""

SHA256 = r"""
import hashlib, os, sys, time
from concurrent.futures import ThreadPoolExecutor
def one(name):
    h = hashlib.sha256()
    with open(os.path.join(sys.argv[1], name), "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
t = time.perf_counter()
names = sorted(os.listdir(sys.argv[1]), key=lambda n: -os.path.getsize(os.path.join(sys.argv[1], n)))
with ThreadPoolExecutor(len(os.sched_getaffinity(0))) as pool:
    list(pool.map(one, names))
print(time.perf_counter() - t)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=None, help="where to write the run (default: a temp dir)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--n-layer", type=int, default=8)
    ap.add_argument("--n-embd", type=int, default=1024)
    args = ap.parse_args()
    xxhsum = shutil.which("xxhsum")
    if xxhsum is None:
        sys.exit("xxhsum not found: install Debian's xxhash package (apt-get install xxhash)")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="drill-bench-"))
    run = work / f"verify-run-{args.n_layer}x{args.n_embd}"
    if not run.exists():
        subprocess.run(
            [sys.executable, "-m", "drill", "demo", str(run), "--steps", "1", "--save-every", "1", "--keep", "1",
             "--n-layer", str(args.n_layer), "--n-embd", str(args.n_embd)],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
    ckpt = run / "step-1"
    files = sorted(str(p) for p in ckpt.iterdir())
    nbytes = sum(os.path.getsize(f) for f in files)
    assert nbytes >= 1 << 30, f"benchmark checkpoint is only {nbytes} bytes"
    subprocess.run([xxhsum, "-H2", *files], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # warm-up

    ledger = work / "verify-ledger.db"
    script = Path(sys.executable).with_name("drill")  # the console script, as a user runs it
    command = [
        str(script) if script.exists() else sys.executable,
        *([] if script.exists() else ["-m", "drill"]),
        "verify",
        str(ckpt),
        "--db",
        str(ledger),
    ]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)  # creates the ledger: later runs find it at head

    parallel_xxhsum = [[xxhsum, "-H2", *share] for share in shares(files, cores())]
    keys = ("a", "b", "c", "c_wall", "c_cpu", "d_wall", "d_cpu", "e", "f_wall", "f_cpu")
    times: dict[str, list[float]] = {k: [] for k in keys}
    for _ in range(args.repeat):
        times["a"].append(inner(PLAIN_LOAD, str(ckpt)))
        times["b"].append(inner(VERIFIED_RESTORE, str(run)))
        times["c"].append(inner(VERIFY_ONLY, str(ckpt)))
        for key, cmds in (
            ("c", [[sys.executable, "-c", VERIFY_ONLY, str(ckpt)]]),
            ("d", parallel_xxhsum),
            ("f", [command]),
        ):
            wall, cpu = outer_cpu(cmds)
            times[f"{key}_wall"].append(wall)
            times[f"{key}_cpu"].append(cpu)
        times["e"].append(inner(SHA256, str(ckpt)))
    m = {k: statistics.median(v) for k, v in times.items()}
    gbps = lambda s: round(nbytes / s / 1e9, 2)  # noqa: E731
    report = {
        "checkpoint": {"path": str(ckpt), "bytes": nbytes, "files": len(files)},
        "cores": cores(),
        "xxhsum processes": len(parallel_xxhsum),
        f"seconds (median of {args.repeat})": {
            "(a) plain dcp.load": round(m["a"], 3),
            "(b) drill verified restore": round(m["b"], 3),
            "(c) drill verify-only": round(m["c"], 3),
            "(c) drill verify-only, whole process": round(m["c_wall"], 3),
            "(d) xxhsum -H2, one process per core, whole processes": round(m["d_wall"], 3),
            "(e) hashlib.sha256 streaming": round(m["e"], 3),
            "(f) drill verify --db, whole process": round(m["f_wall"], 3),
        },
        f"CPU seconds (median of {args.repeat})": {
            "(c) whole process": round(m["c_cpu"], 3),
            "(d) every xxhsum process": round(m["d_cpu"], 3),
            "(f) whole process": round(m["f_cpu"], 3),
        },
        "GB/s": {
            "(a)": gbps(m["a"]),
            "(b)": gbps(m["b"]),
            "(c)": gbps(m["c"]),
            "(d)": gbps(m["d_wall"]),
            "(e)": gbps(m["e"]),
        },
        "ratios": {
            "(b)/(a) target <= 1.10": round(m["b"] / m["a"], 3),
            "(c)/(d) target <= 1.0": round(m["c"] / m["d_wall"], 3),
            "(c)/(d) whole processes": round(m["c_wall"] / m["d_wall"], 3),
            "(f)/(d) whole processes, target <= 1.0": round(m["f_wall"] / m["d_wall"], 3),
            "(f)/(d) CPU seconds": round(m["f_cpu"] / m["d_cpu"], 3),
            "(e)/(c) target >= 5 (sha256 on every core)": round(m["e"] / m["c"], 2),
        },
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
