"""The restore burst on this machine: warm against cold, the reader sweep, and R for a big job.

    python benchmarks/burst.py [--gib-layers 7] [--repeat 3] [--readers 1,2,4] [--no-rgw] [--json]

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
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="drill-burst-", dir=os.environ.get("DRILL_BENCH_DIR")) as tmp:
        run, db = Path(tmp) / "run", f"sqlite:///{tmp}/drill.db"
        subprocess.run([sys.executable, "-m", "drill", "demo", str(run), "--steps", "1", "--save-every", "1", "--n-layer", str(args.gib_layers), "--n-embd", "1024"],
                       check=True, capture_output=True)  # fmt: skip
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


if __name__ == "__main__":
    main()
