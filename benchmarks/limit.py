"""A verified resume against the honest limit: reading each tensor's bytes straight into its
target and hashing every piece as it lands.

    python benchmarks/limit.py [--sizes 0.3,1.2,4.8] [--repeat 5] [--json]

For each size it writes a sealed single-rank DCP checkpoint with ``drill.sdk.save`` (24
tensors, as a model's layers and optimizer moments are), the same state as one ``torch.save``
file and as one safetensors file, warms the page cache, and then times — each way in a fresh
process, the ways interleaved round by round, median of --repeat — the load of that state into
targets allocated from the index:

  limit             every file mapped from the page cache; each of the seal's 16 MiB chunks
                    hashed (xxh3-128) where it lies, reproducing the seal's chunk digests
                    (asserted), and each tensor's bytes in it copied once into its target —
                    what ``torch.load(mmap)`` + copy does, plus the hashing. The chunks are
                    independent: one thread per core this process may run on takes them from
                    one queue, whatever the number of files.
                    Where each tensor's bytes lie is computed before the clock starts: no
                    parsing, no CRC, no record — the floor.
  drill.sdk.load    drill's verified load (``record=False``): index, reader, hash, CRC, proof
  … (recorded)      the same with its drill record (``record=True``): the CPU seconds the
                    record itself takes on the trainer's thread (measured around the call that
                    writes it) are what recording a resume costs the trainer's host (target
                    ≤ 0.1); the difference of the two ways' medians is printed beside it, a
                    cross-check as noisy as two whole loads
  dcp.load          DCP's own FileSystemReader, unverified
  torch.load(mmap)  the ``torch.save`` file mapped, each tensor copied into its target
  safetensors       ``safetensors.torch.load_file`` (when installed), copied into targets

in two modes: ``fresh`` targets (``torch.empty``: first touch happens during the load, as at a
job's start) and ``touched`` ones (written once before the clock starts, as a live trainer's
model is). Each way's wall seconds and CPU seconds are printed; the ratios are
drill.sdk.load / limit (target ≤ 1.10) and drill.sdk.load / dcp.load (target ≤ 0.6). At a size
whose files would not all fit in memory beside the targets, only limit, drill and dcp.load run.
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
from _common import warm

PRELUDE = r"""
import sys, time, resource, warnings, json
warnings.simplefilter("ignore")
import torch
from drill.safe_pickle import restricted_loads
from drill.formats.dcp_index import skeleton
work, mode = sys.argv[1], sys.argv[2]
path = work + "/ckpt"
md = restricted_loads(open(path + "/.metadata", "rb").read())
sd = {k: v for k, v in skeleton(md, torch.device("cpu")).items() if v is not None}
if mode == "touched":
    for v in sd.values():
        v.fill_(1)
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
"""

CLOCK = r"""
c0, t0 = cpu(), time.perf_counter()
"""

DONE = r"""
print(json.dumps({"seconds": time.perf_counter() - t0, "cpu": cpu() - c0} | ({"record": recording[0]} if "recording" in globals() else {})))
"""

SETUP = {
    "limit": r"""
import os, mmap, xxhash
from concurrent.futures import ThreadPoolExecutor
plan = json.load(open(work + "/plan.json"))
""",
    "drill.sdk.load": "import drill.sdk, drill.sdk.verified_load, torch.distributed.checkpoint",
    "drill.sdk.load (recorded)": r"""
import drill.sdk, drill.sdk.resume, drill.sdk.verified_load, torch.distributed.checkpoint, os
os.environ['DRILL_SPOOL_DIR'] = work + '/spool'
recording = [0.0]
_spool = drill.sdk.resume._spool_record
def _timed_spool(*args, **kwargs):  # the record's own CPU on the trainer's thread, not a difference of totals
    c = time.thread_time()
    try:
        return _spool(*args, **kwargs)
    finally:
        recording[0] += time.thread_time() - c
drill.sdk.resume._spool_record = _timed_spool
""",
    "dcp.load": "import torch.distributed.checkpoint as dcp",
    "safetensors": "from safetensors.torch import load_file",
}
"""What each way imports before the clock starts: the load is timed, not the imports."""

WAYS = {
    "limit": r"""
import numpy as np
CHUNK = plan["chunk_size"]
maps = {}
for rel in plan["files"]:
    fd = os.open(path + "/" + rel, os.O_RDONLY)
    maps[rel] = mmap.mmap(fd, 0, prot=mmap.PROT_READ) if plan["files"][rel]["size"] else b""
    os.close(fd)
views = {fqn: t.numpy().view(np.uint8).reshape(-1) for fqn, t in sd.items() if t.dim() > 0}
def chunk(job):
    # One seal chunk of one file, from the page cache mapped: hashed where it lies, and each
    # tensor's bytes in it copied once into their target (numpy lets the GIL go for both the
    # copy and xxhash's update). Chunks are independent: every core takes chunks from one
    # queue whatever the number of files.
    rel, i = job
    f = plan["files"][rel]
    a, b = i * CHUNK, min((i + 1) * CHUNK, f["size"])
    data = np.frombuffer(maps[rel], dtype=np.uint8, count=b - a, offset=a) if b > a else np.empty(0, np.uint8)
    for start, end, fqn in f["tensors"]:
        lo, hi = max(start, a), min(end, b)
        if lo < hi:
            np.copyto(views[fqn][lo - start : hi - start], data[lo - a : hi - a])
    return rel, i, xxhash.xxh3_128_hexdigest(data)
jobs = [(rel, i) for rel, f in sorted(plan["files"].items()) for i in range(max(1, -(-f["size"] // CHUNK)))]
with ThreadPoolExecutor(len(os.sched_getaffinity(0))) as pool:
    for rel, i, digest in pool.map(chunk, jobs):
        assert digest == plan["files"][rel]["chunks"][i], (rel, i)
""",
    "drill.sdk.load": r"""
report = drill.sdk.load(sd, path, record=False)
assert report.sealed and report.verified_files > 0, report
""",
    "drill.sdk.load (recorded)": r"""
report = drill.sdk.load(sd, path, record=True, db="sqlite:///" + work + "/drill.db")
assert report.record is not None and recording[0] > 0
""",
    "dcp.load": r"""
dcp.load(sd, checkpoint_id=path, no_dist=True, planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
""",
    "torch.load(mmap)": r"""
loaded = torch.load(work + "/state.pt", mmap=True, weights_only=True)
for k, v in loaded.items():
    sd[k].copy_(v)
""",
    "safetensors": r"""
for k, v in load_file(work + "/state.safetensors").items():
    sd[k].copy_(v)
""",
}

WRITE = r"""
import sys, torch, drill.sdk, torch.distributed.checkpoint as dcp
work, total = sys.argv[1], float(sys.argv[2])
extras = sys.argv[3:] != ["--no-extras"]
n = 24
per = int(total * 1e9 / n / 4)
g = torch.Generator().manual_seed(0)
state = {f"layers.{i}.weight": torch.randn(per, generator=g) for i in range(n)}
state["step"] = torch.tensor(7)
drill.sdk.save(state, work + "/ckpt", no_dist=True)
if extras:
    torch.save(state, work + "/state.pt")
    try:
        from safetensors.torch import save_file
        save_file(state, work + "/state.safetensors")
    except ImportError:
        pass
"""


def write_checkpoint(work: Path, gigabytes: float, extras: bool) -> None:
    flags = [] if extras else ["--no-extras"]  # the copies' writers hold more copies in memory
    subprocess.run([sys.executable, "-c", WRITE, str(work), str(gigabytes), *flags], check=True, capture_output=True)
    (work / "plan.json").write_text(json.dumps(plan_of(work / "ckpt")))


def plan_of(ckpt: Path) -> dict:
    """Where each tensor's raw bytes lie in each file, and the seal's chunk digests: what the
    limit knows before its clock starts."""
    from drill.formats.dcp_entries import TAIL_BYTES, data_start, records
    from drill.safe_pickle import restricted_loads

    md = restricted_loads((ckpt / ".metadata").read_bytes())
    seal = json.loads((ckpt / "drill-manifest.json").read_text())
    files: dict[str, dict] = {
        f["path"]: {"size": f["size"], "chunks": f["chunks"], "tensors": []}
        for f in seal["files"]
        if f["path"].endswith(".distcp")
    }
    for idx, info in md.storage_data.items():
        if not hasattr(md.state_dict_metadata[idx.fqn], "size") or md.state_dict_metadata[idx.fqn].size.numel() < 2:
            continue  # a scalar or a value: read as part of the file's other bytes
        with open(ckpt / info.relative_path, "rb") as f:
            f.seek(info.offset)
            entry = memoryview(f.read(info.length))
        recs = records(entry[-min(TAIL_BYTES, len(entry)) :], len(entry))
        data = next(r for name, r in recs.items() if name.startswith("data/"))
        start = info.offset + data_start(entry, data)
        files[info.relative_path]["tensors"].append((start, start + data.size, idx.fqn))
    for f in files.values():
        f["tensors"].sort()
    return {"chunk_size": seal["chunk_size"], "files": files}


def run_way(name: str, work: Path, mode: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", PRELUDE + SETUP.get(name, "") + CLOCK + WAYS[name] + DONE, str(work), mode],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def fits(gigabytes: float) -> bool:
    """Whether the checkpoint, its two copies and the targets fit in memory together."""
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return 4.5 * gigabytes * 1e9 < available


def measure(gigabytes: float, repeat: int, only: set[str] | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="drill-limit-") as tmp:
        work = Path(tmp)
        extras = fits(gigabytes)
        write_checkpoint(work, gigabytes, extras)
        ways = [w for w in WAYS if extras or w in ("limit", "drill.sdk.load", "drill.sdk.load (recorded)", "dcp.load")]
        ways = [
            w
            for w in ways
            if only is None or w in only or w in ("limit", "drill.sdk.load", "drill.sdk.load (recorded)", "dcp.load")
        ]
        if not (work / "state.safetensors").exists():
            ways = [w for w in ways if w != "safetensors"]
        warm(work)
        got: dict[str, dict[str, dict[str, list[float]]]] = {}
        for _ in range(repeat):
            for mode in ("fresh", "touched"):
                for way in ways:
                    for k, v in run_way(way, work, mode).items():
                        got.setdefault(mode, {}).setdefault(way, {}).setdefault(k, []).append(v)
        size = sum(p.stat().st_size for p in (work / "ckpt").iterdir())
    med = {
        mode: {way: {k: statistics.median(v) for k, v in m.items()} for way, m in per.items()}
        for mode, per in got.items()
    }
    ratios = {
        mode: {
            "sdk/limit": per["drill.sdk.load"]["seconds"] / per["limit"]["seconds"],
            "sdk/dcp.load": per["drill.sdk.load"]["seconds"] / per["dcp.load"]["seconds"],
            "sdk/limit cpu": per["drill.sdk.load"]["cpu"] / per["limit"]["cpu"],
            "record cpu-s": per["drill.sdk.load (recorded)"]["record"],
            "record cpu-s by difference": per["drill.sdk.load (recorded)"]["cpu"] - per["drill.sdk.load"]["cpu"],
        }
        for mode, per in med.items()
    }
    return {"bytes": size, "ways": med, "ratios": ratios}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="0.3,1.2,4.8", help="checkpoint sizes in GB, comma-separated")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--ways", default=None, help="besides limit, drill.sdk.load and dcp.load, only these (comma-separated)"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    only = set(args.ways.split(",")) if args.ways is not None else None
    figures = {size: measure(float(size), args.repeat, only) for size in args.sizes.split(",")}
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for f in figures.values():
        print(f"{f['bytes'] / 1e9:.2f} GB checkpoint, median of {args.repeat}, fresh processes, page cache warm")
        for mode, per in f["ways"].items():
            cells = "  ".join(f"{way} {m['seconds']:.3f} s ({m['cpu']:.2f} CPU-s)" for way, m in per.items())
            r = f["ratios"][mode]
            print(f"  {mode:<8} {cells}")
            print(
                f"  {'':<8} drill.sdk.load / limit = {r['sdk/limit']:.2f} (CPU {r['sdk/limit cpu']:.2f})   drill.sdk.load / dcp.load = {r['sdk/dcp.load']:.2f}"
                f"   the resume record: {r['record cpu-s']:.3f} CPU-s (the two ways' difference {r['record cpu-s by difference']:+.3f})"
            )


if __name__ == "__main__":
    main()
