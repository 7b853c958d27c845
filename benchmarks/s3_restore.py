"""Restoring a checkpoint from S3, side by side with its baselines, against Ceph's radosgw.

    python benchmarks/s3_restore.py [--workdir DIR] [--repeat 3] [--concurrency 8] [--part-size 8MiB]

A real S3 implementation is started on 127.0.0.1 (one monitor, one memstore OSD, radosgw:
tests/support/radosgw.py; needs Debian's ceph-mon ceph-osd radosgw ceph-common). moto is no use here:
it copies the whole object for every ranged GET. The checkpoint is the project's own training
code's (`drill demo --n-layer 4 --n-embd 1024`: ≥ 512 MiB, sealed as it is saved), uploaded
once. Each variant runs in a fresh process, interleaved, median of --repeat runs, imports
excluded from the time:

  (a) single stream: `get_object()["Body"].read()` in 8 MiB reads, object after object
      (bytes fetched, nothing hashed or loaded);
  (b) boto3's managed transfer: `download_file` with a TransferConfig of the same concurrency
      and part size into a temporary directory, then an xxh3-128 hash of the files (what
      checking them against drill's manifest costs), files deleted afterwards;
  (c) s3torchconnector's DCP reader (`S3StorageReader`): an unverified `dcp.load` into targets
      allocated from the metadata — the peer a PyTorch user would pick;
  (d) drill's verified restore from the s3:// URI: the same load, every byte hashed and checked
      against the manifest in the same pass.

Peak RSS is each process's own maximum (torch imported in every one of them).
Targets: (d) no slower than (b) or (c); (a)/(d) ≥ 2.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.support.radosgw import RadosGateway, available  # noqa: E402

BUCKET, PREFIX = "drill-bench", "run"

_TAIL = """
import resource
print(elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""

SINGLE_STREAM = (
    r"""
import os, sys, time, boto3
bucket, prefix = sys.argv[1], sys.argv[2]
s3 = boto3.client("s3")
keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")["Contents"]]
t = time.perf_counter()
n = 0
for key in keys:
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    while chunk := body.read(8 << 20):
        n += len(chunk)
elapsed = time.perf_counter() - t
"""
    + _TAIL
)

MANAGED = (
    r"""
import os, sys, time, shutil, tempfile, boto3, xxhash
from boto3.s3.transfer import TransferConfig
bucket, prefix, conc, part = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
s3 = boto3.client("s3")
keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")["Contents"]]
cfg = TransferConfig(max_concurrency=conc, multipart_chunksize=part, multipart_threshold=part)
out = tempfile.mkdtemp(prefix="drill-bench-dl-")
t = time.perf_counter()
for key in keys:
    path = os.path.join(out, key.rsplit("/", 1)[-1])
    s3.download_file(bucket, key, path, Config=cfg)
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
elapsed = time.perf_counter() - t
shutil.rmtree(out)
"""
    + _TAIL
)

S3TORCH = (
    r"""
import os, sys, time, warnings
warnings.simplefilter("ignore")
import torch, torch.distributed.checkpoint as dcp
from s3torchconnector import S3ClientConfig
from s3torchconnector.dcp import S3StorageReader
from drill.formats.dcp_index import skeleton
uri, part = sys.argv[1], int(sys.argv[2])
t = time.perf_counter()
reader = S3StorageReader(os.environ["AWS_REGION"], uri, s3client_config=S3ClientConfig(force_path_style=True, part_size=part))
md = reader.read_metadata()
sd = {k: v for k, v in skeleton(md, torch.device("cpu")).items() if v is not None}
dcp.load(sd, storage_reader=reader, no_dist=True, planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
elapsed = time.perf_counter() - t
"""
    + _TAIL
)

DRILL = (
    r"""
import sys, time, torch
from drill.discover import discover
from drill.integrity.sampling import SampleSpec
from drill.integrity.verify import Observed, integrity_check, plan_integrity
from drill.formats import restore
import drill.formats.dcp_read, boto3  # imported before the clock, as the baselines import theirs
from drill.storage import storage_for
root = sys.argv[1]
storage = storage_for(root)
t = time.perf_counter()
ref = discover(storage, root).checkpoints[-1]
plan = plan_integrity(storage, ref.uri, SampleSpec("all"))
r = restore(storage, ref, torch.device("cpu"), hash_plan=plan.hash_plan)
check = integrity_check(plan, {f.relative_path: Observed(hashes=f.hashes) for f in r.files})
elapsed = time.perf_counter() - t
assert not r.failures and not check.findings, (r.failures, check.findings)
assert check.evidence["bytes_verified"] == check.evidence["bytes_listed"]
"""
    + _TAIL
)


def child(script: str, *args: str, env: dict[str, str]) -> tuple[float, int]:
    """(seconds, peak RSS in bytes) of ``script`` run in a fresh interpreter."""
    res = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, cwd=ROOT)
    if res.returncode:
        raise RuntimeError(res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}")
    seconds, rss_kib = res.stdout.split()[-2:]
    return float(seconds), int(rss_kib) * 1024


def make_run(work: Path) -> Path:
    run = work / "s3-run"
    if not run.exists():
        subprocess.run(
            [sys.executable, "-m", "drill", "demo", str(run), "--steps", "1", "--save-every", "1", "--keep", "1",
             "--n-layer", "4", "--n-embd", "1024"],
            check=True, stdout=subprocess.DEVNULL, cwd=ROOT,
        )  # fmt: skip
    return run


def upload(rgw: RadosGateway, run: Path) -> int:
    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=rgw.url,
        aws_access_key_id=rgw.access_key,
        aws_secret_access_key=rgw.secret_key,
        region_name="us-east-1",
    )
    s3.create_bucket(Bucket=BUCKET)
    nbytes = 0
    for path in sorted(p for p in run.rglob("*") if p.is_file()):
        s3.upload_file(str(path), BUCKET, f"{PREFIX}/{path.relative_to(run).as_posix()}")
        if path.parent.name == "step-1" and path.name != "drill-manifest.json":
            nbytes += path.stat().st_size
    return nbytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=None, help="where to write the run (default: a temp dir)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--concurrency", type=int, default=8, help="ranged GETs in flight, for drill and boto3's transfer alike"
    )
    ap.add_argument("--part-size", default="8MiB")
    args = ap.parse_args()
    if not available():
        sys.exit("Ceph is not installed: apt-get install ceph-mon ceph-osd radosgw ceph-common")
    from drill.units import parse_size

    part = parse_size(args.part_size)
    run = make_run(args.workdir or Path(tempfile.mkdtemp(prefix="drill-bench-")))
    with RadosGateway(memstore_bytes=4 << 30) as rgw:
        nbytes = upload(rgw, run)
        assert nbytes >= 512 << 20, f"benchmark checkpoint is only {nbytes} bytes"
        env = {
            **os.environ, "AWS_ENDPOINT_URL": rgw.url, "AWS_ACCESS_KEY_ID": rgw.access_key, "AWS_SECRET_ACCESS_KEY": rgw.secret_key,
            "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1", "DRILL_S3_ADDRESSING_STYLE": "path",
            "DRILL_S3_CONCURRENCY": str(args.concurrency), "DRILL_S3_PART_SIZE": str(part),
        }  # fmt: skip
        uri = f"s3://{BUCKET}/{PREFIX}"
        variants = {
            "(a) single stream get_object().read()": (SINGLE_STREAM, BUCKET, f"{PREFIX}/step-1"),
            "(b) boto3 download_file + xxh3-128": (
                MANAGED,
                BUCKET,
                f"{PREFIX}/step-1",
                str(args.concurrency),
                str(part),
            ),
            "(c) s3torchconnector dcp.load, unverified": (S3TORCH, f"{uri}/step-1", str(part)),
            "(d) drill verified restore": (DRILL, uri),
        }
        times: dict[str, list[float]] = {k: [] for k in variants}
        rss: dict[str, int] = {}
        errors: dict[str, str] = {}
        for _ in range(args.repeat):
            for name, (script, *argv) in variants.items():
                if name in errors:
                    continue
                try:
                    seconds, peak = child(script, *argv, env=env)
                except RuntimeError as exc:
                    errors[name] = str(exc)
                    continue
                times[name].append(seconds)
                rss[name] = max(rss.get(name, 0), peak)
    report(nbytes, args, times, rss, errors)


def report(
    nbytes: int, args: argparse.Namespace, times: dict[str, list[float]], rss: dict[str, int], errors: dict[str, str]
) -> None:
    m = {k: statistics.median(v) for k, v in times.items() if v}
    a, b, c, d = (m.get(k) for k in times)
    ratio = lambda x, y: round(x / y, 2) if x and y else None  # noqa: E731
    print(json.dumps({
        "checkpoint": {"bytes": nbytes, "server": "Ceph radosgw (memstore OSD) on 127.0.0.1", "concurrency": args.concurrency, "part_size": args.part_size},
        f"seconds (median of {args.repeat})": {k: round(v, 3) for k, v in m.items()},
        "MB/s": {k: round(nbytes / v / 1e6) for k, v in m.items()},
        "peak RSS MiB": {k: round(v / 2**20) for k, v in rss.items()},
        "ratios": {
            "(a)/(d) single stream over drill, target >= 2": ratio(a, d),
            "(b)/(d) managed transfer + hash over drill, target >= 1": ratio(b, d),
            "(c)/(d) s3torchconnector over drill, target >= 1": ratio(c, d),
        },
        **({"not run": errors} if errors else {}),
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
