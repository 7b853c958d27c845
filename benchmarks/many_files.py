"""Per-file costs: a checkpoint of thousands of small files, verified and loaded.

    python benchmarks/many_files.py [--files 2000,20000] [--repeat 3] [--json]

For each count it writes a sealed single-rank DCP checkpoint with ``drill.sdk.save(...,
single_file_per_rank=False)`` — one file per tensor, 16 KiB each — warms the page cache, and
times, interleaved round by round, median of --repeat, each in a fresh process:

  drill verify CKPT          vs  xxhsum -H2 over every file, one process per core (find | xargs -P), whole processes
  drill.sdk.load             vs  dcp.load, into targets allocated from the index (imports
                                 excluded: both import torch.distributed.checkpoint first)

and prints each pair's ratio (targets: verify ≤ 2× xxhsum; sdk.load ≤ 1.0× dcp.load) and the
cost per file beyond each baseline's. Beside the verify pair it times the *Python floor*, a
whole process too: the least any verifier written in Python does per file — list the directory
with a ``stat`` of each entry, ``json.loads`` the seal, then on two processes ``openat`` +
``fstat`` + one ``pread`` + xxh3-128 + ``close`` of each file and a comparison with its sealed
digest — nothing else (no findings, no ledger, no format). ``drill verify / floor`` is what drill
itself adds; ``floor / xxhsum`` what the interpreter costs before drill does anything.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ENV, cores, outer

WRITE = r"""
import sys, warnings, torch, drill.sdk
warnings.simplefilter("ignore")
g = torch.Generator().manual_seed(0)
state = {f"p{i}": torch.randn(4096, generator=g) for i in range(int(sys.argv[2]))}
drill.sdk.save(state, sys.argv[1], no_dist=True, single_file_per_rank=False, sync_files=False)
"""

FLOOR = r"""
import json, os, sys, xxhash
root = sys.argv[1]
d = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
with os.scandir(root) as it:
    sizes = {e.name: e.stat(follow_symlinks=False).st_size for e in it if e.is_file(follow_symlinks=False)}
seal = json.loads(open(os.path.join(root, "drill-manifest.json"), "rb").read())
sealed = {f["path"]: f["chunks"] for f in seal["files"]}
names = sorted(sealed)
r, w = os.pipe()
pid = os.fork()
bad = 0
for name in names[len(names) // 2 :] if pid == 0 else names[: len(names) // 2]:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=d)
    os.fstat(fd)
    data = os.pread(fd, sizes[name] + 1, 0)
    os.close(fd)
    bad += len(data) != sizes[name] or [xxhash.xxh3_128_hexdigest(data)] != sealed[name]
if pid == 0:
    os.write(w, str(bad).encode())
    os._exit(0)
os.close(w)
bad += int(os.read(r, 64) or 0)
os.waitpid(pid, 0)
assert bad == 0, bad
"""
"""The Python floor: every file of the checkpoint is one chunk (16 KiB files), so one digest each."""

LOAD = r"""
import sys, time, warnings
warnings.simplefilter("ignore")
import torch, torch.distributed.checkpoint as dcp, drill.sdk, drill.sdk.verified_load
from drill.safe_pickle import restricted_loads
from drill.formats.dcp_index import skeleton
path, way = sys.argv[1], sys.argv[2]
md = restricted_loads(open(path + "/.metadata", "rb").read())
sd = {k: v for k, v in skeleton(md, torch.device("cpu")).items() if v is not None}
t = time.perf_counter()
if way == "dcp.load":
    dcp.load(sd, checkpoint_id=path, no_dist=True)
else:
    report = drill.sdk.load(sd, path, record=False)
    assert report.sealed and report.verified_files > 0
print(time.perf_counter() - t)
"""


def wall(cmd: list[str] | str) -> float:
    return outer(cmd, ENV)


def load(ckpt: Path, way: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", LOAD, str(ckpt), way], check=True, capture_output=True, text=True, env=ENV
    ).stdout
    return float(out.strip().splitlines()[-1])


def measure(files: int, repeat: int, work: Path) -> dict:
    ckpt = work / f"ckpt-{files}"
    subprocess.run([sys.executable, "-c", WRITE, str(ckpt), str(files)], check=True, capture_output=True, env=ENV)
    subprocess.run(f"cat {ckpt}/* {ckpt}/.metadata > /dev/null", shell=True, check=True)
    db = ["--db", f"sqlite:///{work}/v-{files}.db"]
    wall(["drill", "verify", str(ckpt), *db])  # warm-up: bytecode, ledger
    got: dict[str, list[float]] = {}
    for _ in range(repeat):
        got.setdefault("drill verify", []).append(wall(["drill", "verify", str(ckpt), *db]))
        # xxhsum at its best: one process per core (xargs -P), the files dealt in batches
        every = (
            f"cd {ckpt} && find . -type f -print0 | xargs -0 -P {cores()} -n {max(1, files // cores() + 1)} xxhsum -H2"
        )
        got.setdefault("xxhsum -H2", []).append(wall(every))
        got.setdefault("Python floor", []).append(wall([sys.executable, "-c", FLOOR, str(ckpt)]))
        got.setdefault("drill.sdk.load", []).append(load(ckpt, "drill.sdk.load"))
        got.setdefault("dcp.load", []).append(load(ckpt, "dcp.load"))
    shutil.rmtree(ckpt)
    med = {k: statistics.median(v) for k, v in got.items()}
    return {
        "files": files,
        "seconds": med,
        "verify/xxhsum": med["drill verify"] / med["xxhsum -H2"],
        "verify/floor": med["drill verify"] / med["Python floor"],
        "floor/xxhsum": med["Python floor"] / med["xxhsum -H2"],
        "sdk.load/dcp.load": med["drill.sdk.load"] / med["dcp.load"],
        "ms per file beyond xxhsum": (med["drill verify"] - med["xxhsum -H2"]) / files * 1e3,
        "ms per file, sdk.load and dcp.load": (med["drill.sdk.load"] / files * 1e3, med["dcp.load"] / files * 1e3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", default="2000,20000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not shutil.which("xxhsum"):
        raise SystemExit("xxhsum is not installed (Debian: apt-get install xxhash)")
    with tempfile.TemporaryDirectory(prefix="drill-many-") as tmp:
        figures = [measure(int(n), args.repeat, Path(tmp)) for n in args.files.split(",")]
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for f in figures:
        s = f["seconds"]
        print(f"{f['files']:,} files of 16 KiB, median of {args.repeat}")
        print(
            f"  drill verify {s['drill verify']:.3f} s  xxhsum -H2 {s['xxhsum -H2']:.3f} s  ratio {f['verify/xxhsum']:.2f}"
        )
        print(
            f"  Python floor {s['Python floor']:.3f} s  drill verify / floor {f['verify/floor']:.2f}  floor / xxhsum {f['floor/xxhsum']:.2f}"
        )
        print(
            f"  drill.sdk.load {s['drill.sdk.load']:.3f} s  dcp.load {s['dcp.load']:.3f} s  ratio {f['sdk.load/dcp.load']:.2f}"
        )


if __name__ == "__main__":
    main()
