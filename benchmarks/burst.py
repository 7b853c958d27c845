"""The restore burst on this machine: warm against cold, the reader sweep, and R for a big job.

    python benchmarks/burst.py [--gib-layers 7] [--repeat 3] [--readers 1,2,4] [--no-rgw] [--json]
                               [--only-independent] [--throttle-mbps 400]

1. A ~1 GB sealed demo checkpoint (``drill demo --n-layer 7 --n-embd 1024``), restored by
   ``drill run --no-replay`` warm (page cache as it is, after a first read) and cold
   (``--cold``: the checkpoint dropped from the page cache first), interleaved, medians of
   the restore latency and read bandwidth: cold / warm.
2. ``drill burst`` of it from local disk, cold, over the reader counts: aggregate bandwidth
   per step and the ceiling.
3. The same from Ceph radosgw on 127.0.0.1 (tests/support/radosgw.py) when Ceph is installed.
4. The projected R for a 405B-class checkpoint (5.7 TB) restored by 16,384 GPUs' ranks, from
   the measured ceiling, with the arithmetic (and its warnings: one host's ceiling, 10⁶× the
   bytes measured).
5. The burst's own ceiling against an independent reader on the same files at the same reader
   counts — ``fio`` when installed, else plain processes reading with ``os.preadv`` into one
   buffer and hashing with xxh3, released from one barrier right after the page cache was
   dropped, as drill's readers are (reads in the first seconds after a drop come from a VM
   disk's own cache, so both must read the same time after it): the ratio drill / independent
   per step (target: within 15%), so that the burst measures the storage, not drill's readers.
6. Both again against a storage of known bandwidth: this process and its readers in a
   block-I/O cgroup that holds reads from the checkpoint's disk to ``--throttle-mbps`` in all
   (root and a cgroup blkio/io controller needed): the burst against that limit (target:
   within 15%) — the one comparison a VM disk's own cache cannot blur.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/support/radosgw.py


def drill(*args: str, env: dict[str, str] | None = None) -> dict:
    res = subprocess.run(
        [sys.executable, "-m", "drill", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=True,
    )
    return json.loads(res.stdout)


def restore(run: Path, db: str, cold: bool) -> tuple[float, float]:
    doc = drill("run", "--root", str(run), "--db", db, "--no-replay", "--json", "-q", *(["--cold"] if cold else []))
    return doc["timings"]["restore"], doc["throughput_bps"]


def sweep(root: str, readers: str, db: str, env: dict[str, str] | None = None) -> dict:
    return drill(
        "burst",
        "--root",
        root,
        "--readers",
        readers,
        "--db",
        db,
        "--json",
        "--job-bytes",
        "5.7TB",
        "--job-readers",
        "16384",
        env=env,
    )


def _independent_reader(files: list[tuple[str, int]], ready, barrier, out) -> None:  # type: ignore[no-untyped-def]
    """One plain reader: positioned reads into one 8 MiB buffer, xxh3 over them; no drill, no torch."""
    import time

    import xxhash

    buf = bytearray(8 << 20)
    view = memoryview(buf)
    ready.put(None)
    barrier.wait()
    started, done = time.monotonic(), 0
    for path, _ in files:
        h = xxhash.xxh3_128()
        fd = os.open(path, os.O_RDONLY)
        try:
            offset = 0
            while n := os.preadv(fd, [view], offset):
                h.update(view[:n])
                offset += n
        finally:
            os.close(fd)
        done += offset
    out.put((started, time.monotonic(), done))


def independent(checkpoint: Path, readers: int) -> float:
    """Aggregate bytes/s of ``readers`` plain processes on the checkpoint's files, cold, shared as
    the burst shares them, timed from the barrier to the last reader's end. As in drill's burst,
    the page cache is dropped once every reader is ready, just before the barrier: a VM's disk
    serves reads in the first seconds after a drop from a cache below the guest's (measured
    here: 2.5 GB/s at once, 0.94 GB/s three seconds later), so both must read the same time
    after the drop."""
    import multiprocessing

    from drill.restore.partition import assign

    sizes = {p.name: p.stat().st_size for p in checkpoint.iterdir() if p.is_file()}
    ctx = multiprocessing.get_context("spawn")
    ready, barrier, out = ctx.Queue(), ctx.Barrier(readers + 1), ctx.Queue()
    shares = [[(str(checkpoint / rel), sizes[rel]) for rel in share] for share in assign(sizes, readers)]
    procs = [ctx.Process(target=_independent_reader, args=(share, ready, barrier, out)) for share in shares]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=600)
    for name in sizes:
        fd = os.open(checkpoint / name, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    barrier.wait()
    got = [out.get(timeout=3600) for _ in procs]
    for p in procs:
        p.join()
    return sum(g[2] for g in got) / (max(g[1] for g in got) - min(g[0] for g in got))


def fio(checkpoint: Path, readers: int) -> float | None:
    """fio's aggregate read bandwidth on the same files, ``readers`` jobs, page cache dropped; None without fio."""
    import shutil

    if shutil.which("fio") is None:
        return None
    files = sorted(str(p) for p in checkpoint.iterdir() if p.is_file())
    res = subprocess.run(["fio", "--name=burst", "--rw=read", "--bs=8m", "--invalidate=1", "--ioengine=psync", "--group_reporting",
                          f"--numjobs={readers}", "--filename=" + ":".join(files), "--output-format=json"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    return float(json.loads(res.stdout)["jobs"][0]["read"]["bw_bytes"])


class Throttled:
    """A storage of known bandwidth: this process (and the readers it starts) in a block-I/O
    cgroup whose reads from the checkpoint's disk the kernel holds to ``bps`` in all (cgroup v1
    ``blkio.throttle.read_bps_device``, v2 ``io.max``). Against it the burst's ceiling has a
    true answer. ``reason`` says why this host cannot (not root, no such controller)."""

    def __init__(self, path: Path, bps: int) -> None:
        self.bps, self.reason, self.group, self.v1 = bps, None, None, True
        dev = os.stat(path).st_dev
        majmin = f"{os.major(dev)}:{os.minor(dev)}"
        parent = Path(f"/sys/dev/block/{majmin}/partition")
        if parent.exists():  # throttles apply to the whole disk
            majmin = (Path(f"/sys/dev/block/{majmin}").resolve().parent / "dev").read_text().strip()
        self.majmin = majmin
        v1, v2 = Path("/sys/fs/cgroup/blkio"), Path("/sys/fs/cgroup")
        if os.geteuid() != 0:
            self.reason = "not root"
        elif v1.is_dir():
            self.group = v1 / f"drill-burst-{os.getpid()}"
        elif (v2 / "cgroup.subtree_control").exists() and "io" in (v2 / "cgroup.subtree_control").read_text():
            self.group, self.v1 = v2 / f"drill-burst-{os.getpid()}", False
        else:
            self.reason = "no block-I/O cgroup controller"

    def __enter__(self) -> Throttled:
        assert self.group is not None
        self.group.mkdir()
        if self.v1:
            (self.group / "blkio.throttle.read_bps_device").write_text(f"{self.majmin} {self.bps}")
        else:
            (self.group / "io.max").write_text(f"{self.majmin} rbps={self.bps}")
        (self.group / "cgroup.procs").write_text(str(os.getpid()))
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.group is not None
        (self.group.parent / "cgroup.procs").write_text(str(os.getpid()))
        self.group.rmdir()


def against_independent(checkpoint: Path, readers: str, db: str, repeat: int = 3) -> list[dict]:
    """Per reader count: drill's burst step and the independent readers' aggregate (medians of
    ``repeat``, interleaved: this disk's cold reads vary by ±30% run to run), fio's, the ratio."""
    drills: dict[int, list[float]] = {}
    plains: dict[int, list[float]] = {}
    counts = [int(n) for n in readers.split(",")]
    for rep in range(repeat):
        # Alternate which goes first: a VM's disk keeps its own cache below the guest's page
        # cache, so whichever reads second may read warmer.
        if rep % 2:
            for n in counts:
                plains.setdefault(n, []).append(independent(checkpoint, n))
        doc = drill("burst", "--root", str(checkpoint.parent), "--readers", readers, "--db", db, "--json")
        for step in doc["steps"]:
            drills.setdefault(step["readers"], []).append(step["aggregate_bps"])
        if not rep % 2:
            for n in counts:
                plains.setdefault(n, []).append(independent(checkpoint, n))
    rows = []
    for n in sorted(drills):
        ours, plain, peer = statistics.median(drills[n]), statistics.median(plains[n]), fio(checkpoint, n)
        rows.append({"readers": n, "drill_bps": ours, "independent_bps": plain, "fio_bps": peer,
                     "drill/independent": ours / max(plain, peer or 0.0),
                     "ratios": sorted(d / i for d, i in zip(drills[n], plains[n], strict=True))})  # fmt: skip
    return rows


def rgw_sweep(run: Path, readers: str, db: str) -> dict | None:
    from tests.support import radosgw

    if not radosgw.available():
        return None
    import boto3

    with radosgw.RadosGateway() as rgw:
        client = boto3.client(
            "s3",
            endpoint_url=rgw.url,
            aws_access_key_id=rgw.access_key,
            aws_secret_access_key=rgw.secret_key,
            region_name="us-east-1",
        )
        client.create_bucket(Bucket="burst")
        ckpt = sorted(p for p in run.iterdir() if p.name.startswith("step-"))[-1]
        for f in ckpt.iterdir():
            client.upload_file(str(f), "burst", f"run/{ckpt.name}/{f.name}")
        env = {"AWS_ACCESS_KEY_ID": rgw.access_key, "AWS_SECRET_ACCESS_KEY": rgw.secret_key, "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": rgw.url,
               "DRILL_S3_ADDRESSING_STYLE": "path"}  # fmt: skip
        return sweep("s3://burst/run", readers, db, env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib-layers", type=int, default=7, help="--n-layer of the demo at --n-embd 1024 (7: ~1.06 GB)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--readers", default="1,2,4")
    ap.add_argument("--no-rgw", action="store_true")
    ap.add_argument(
        "--only-independent", action="store_true", help="only part 5: the burst against independent readers"
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--throttle-mbps", type=int, default=400, help="the known storage's bandwidth, MiB/s (part 6)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="drill-burst-", dir=os.environ.get("DRILL_BENCH_DIR")) as tmp:
        run, db = Path(tmp) / "run", f"sqlite:///{tmp}/drill.db"
        subprocess.run([sys.executable, "-m", "drill", "demo", str(run), "--steps", "1", "--save-every", "1", "--n-layer", str(args.gib_layers), "--n-embd", "1024"],
                       check=True, capture_output=True)  # fmt: skip
        ckpt = sorted(p for p in run.iterdir() if p.name.startswith("step-"))[-1]
        versus = against_independent(ckpt, args.readers, db, args.repeat)
        limit, throttled = Throttled(ckpt, args.throttle_mbps << 20), None
        if limit.reason is None:
            with limit:
                throttled = against_independent(ckpt, args.readers, db, args.repeat)
        if args.only_independent:
            _print_versus(versus, args.json)
            _print_throttled(throttled, limit, args.json)
            return
        warm, cold = [], []
        restore(run, db, cold=False)  # the first read warms the cache
        for _ in range(args.repeat):
            warm.append(restore(run, db, cold=False))
            cold.append(restore(run, db, cold=True))
        local = sweep(str(run), args.readers, db)
        rgw = None if args.no_rgw else rgw_sweep(run, args.readers, db)
    med = lambda xs, i: statistics.median(x[i] for x in xs)  # noqa: E731
    out = {
        "checkpoint_bytes": local["bytes"],
        "warm": {"restore_s": med(warm, 0), "throughput_bps": med(warm, 1)}, "cold": {"restore_s": med(cold, 0), "throughput_bps": med(cold, 1)},
        "cold/warm restore": med(cold, 0) / med(warm, 0),
        "local": {"steps": [(s["readers"], s["aggregate_bps"]) for s in local["steps"]], "ceiling_bps": local["ceiling_bps"], "ceiling_readers": local["ceiling_readers"],
                  "restart": local["restart"]},
        "versus_independent": versus,
        "throttled": {"limit_bps": limit.bps, "steps": throttled},
        "radosgw": None if rgw is None else {"steps": [(s["readers"], s["aggregate_bps"]) for s in rgw["steps"]], "ceiling_bps": rgw["ceiling_bps"],
                                             "ceiling_readers": rgw["ceiling_readers"], "restart": rgw["restart"]},
    }  # fmt: skip
    if args.json:
        print(json.dumps(out, indent=1))
        return
    gb = 1e9
    print(f"checkpoint {out['checkpoint_bytes'] / gb:.2f} GB; medians of {args.repeat}:")
    print(f"  warm restore {out['warm']['restore_s']:.3f} s ({out['warm']['throughput_bps'] / gb:.2f} GB/s); cold {out['cold']['restore_s']:.3f} s "
          f"({out['cold']['throughput_bps'] / gb:.2f} GB/s); cold / warm {out['cold/warm restore']:.2f}")  # fmt: skip
    _print_versus(versus, False)
    _print_throttled(throttled, limit, False)
    for name in ("local", "radosgw"):
        part = out[name]
        if part is None:
            print(f"  {name}: not measured (Ceph not installed, or --no-rgw)")
            continue
        steps = ", ".join(f"{n} → {bps / gb:.3f} GB/s" for n, bps in part["steps"])
        ceiling = (
            f"ceiling {part['ceiling_bps'] / gb:.3f} GB/s at {part['ceiling_readers']}"
            if part["ceiling_readers"]
            else "no ceiling within the sweep"
        )
        print(f"  {name} sweep (cold): {steps}; {ceiling}")
        print(f"  projected R for 5.7 TB on 16,384 GPUs from {name}: {part['restart']['restart_s']:,.0f} s")
        for line in part["restart"]["explanation"]:
            print(f"    {line}")
        for w in part["restart"]["warnings"]:
            print(f"    warning: {w}")


def _print_throttled(rows: list[dict] | None, limit: Throttled, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"throttled": rows, "limit_bps": limit.bps}, indent=1))
        return
    if rows is None:
        print(f"  a storage of known bandwidth: not measured ({limit.reason})")
        return
    gb = 1e9
    print(
        f"  a storage of known bandwidth — reads held by the kernel to {limit.bps / gb:.3f} GB/s in all (target: the burst within 15% of it):"
    )
    for r in rows:
        print(f"    {r['readers']} reader(s): drill {r['drill_bps'] / gb:.3f} GB/s ({r['drill_bps'] / limit.bps:.2f} of the limit), "
              f"plain readers {r['independent_bps'] / gb:.3f} GB/s ({r['independent_bps'] / limit.bps:.2f}); drill / plain {r['drill/independent']:.2f}")  # fmt: skip


def _print_versus(rows: list[dict], as_json: bool) -> None:
    if as_json:
        print(json.dumps({"versus_independent": rows}, indent=1))
        return
    gb = 1e9
    print("  the burst against independent readers (same files, same counts, cold; target: within 15%):")
    for r in rows:
        peer = "no fio" if r["fio_bps"] is None else f"fio {r['fio_bps'] / gb:.3f} GB/s"
        print(f"    {r['readers']} reader(s): drill {r['drill_bps'] / gb:.3f} GB/s, plain readers {r['independent_bps'] / gb:.3f} GB/s, "
              f"{peer}; drill / best {r['drill/independent']:.2f} (each repeat: {', '.join(f'{x:.2f}' for x in r['ratios'])})")  # fmt: skip


if __name__ == "__main__":
    main()
