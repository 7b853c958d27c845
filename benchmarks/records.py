"""Records at a year of nightly drills: the full audit pass, metrics and a 30-day report against
the number of drills recorded, each beside a limit measured in the same run.

    python benchmarks/records.py [--drills 2000,20000,200000] [--json]

For each size it builds one SQLite record database as drill writes it (its own migrations, its
own sealing: a drill is one row, its checks and replayed steps one document on it), from real
drills of a demo run — one that passed with its replay, one that failed
on a flipped byte with its findings, one that ended in an error — cloned into varied records:
24 runs, each with a model of its own (its own tensor inventory, so its evidence is its own), a
checkpoint a day, drills spread over the last 365 days, one in twenty failed and one in a
hundred an error, every timing, loss and grad norm drawn afresh. Every record is sealed into
the audit chain (:func:`drill.records.audit.seal_drills`). Then, each in a fresh process (what
cron runs), median of three, wall seconds and peak memory (max RSS) of:

  drill audit verify                   the whole log: every entry, every record's digest
                                        (target at 200,000 drills: <= 5 s, <= 300 MB)
  drill metrics --textfile F           (target < 1 s and < 200 MB at every size)
  drill report --since 30d -f html     the drills of the last 30 days (target < 5 s, < 500 MB)

and, side by side:

  limit: hash the database file        every byte of the database file read and SHA-256'd,
                                        by as many processes as this one may use cores — the
                                        least a pass that proves every record's bytes can do
  baseline: import drill.cli.app       the start-up every command pays

Databases are cached in $TMPDIR by size and layout version (200,000 drills: ~4 GB, a few
minutes to build).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

LAYOUT = 4
"""Raised when the records built change: a cached database of another layout is rebuilt."""
RUNS = 24
FAILED_EVERY = 20
ERROR_EVERY = 100
DAYS = 365


def templates(work: Path) -> dict[str, dict]:
    """Real drills' rows, by status: passed (with its replay), failed (a flipped byte), error."""
    from sqlalchemy import create_engine, select

    from drill.records.models import Checkpoint, Drill

    demo, db = work / "demo", f"sqlite:///{work}/template.db"
    subprocess.run(["drill", "demo", str(demo)], check=True, capture_output=True)
    subprocess.run(["drill", "run", "--root", str(demo), "--db", db], check=True, capture_output=True)
    shard = next(p for p in sorted((demo / "step-100").iterdir()) if p.suffix == ".distcp")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    subprocess.run(["drill", "run", "--root", str(demo), "--db", db, "--no-replay"], capture_output=True)
    (demo / "run.json").write_text(json.dumps({"replay": {"entrypoint": "no_such_module:build"}}))
    subprocess.run(["drill", "run", "--root", str(demo), "--db", db, "--checkpoint", "step:90"], capture_output=True)
    from sqlalchemy.orm import Session

    from drill.records.rows import evidence_of

    engine = create_engine(db)
    out = {}
    with Session(engine) as c:
        for d in c.execute(select(Drill.__table__).order_by(Drill.id)).mappings():
            drill = dict(d)
            details = dict(drill["details"] or {})
            details["checks"] = [{**k, "evidence": evidence_of(c, k["evidence"])} for k in details.get("checks", [])]
            drill["details"] = details  # every evidence in full: stored again, as drill stores it, in the new database
            out.setdefault(d["status"], {
                "drill": drill,
                "checkpoint": dict(c.execute(select(Checkpoint.__table__).where(Checkpoint.id == d["checkpoint_id"])).mappings().one()),
            })  # fmt: skip
    engine.dispose()
    assert {"passed", "failed"} <= out.keys(), sorted(out)
    return out


def _model_of(run: int, evidence: dict) -> dict:
    """The keys check's evidence as a run with a model of its own would record it."""
    rng = random.Random(run)
    width = 64 * (1 + run % 4)
    inventory = [
        {
            **e,
            "key": e["key"].replace("blocks.", f"layers.{run}."),
            "shape": [width if s == 64 else s for s in e["shape"]],
        }
        for e in evidence.get("inventory", [])
    ]
    rng.shuffle(inventory)
    return {**evidence, "inventory": inventory}


def _details(details: dict, model: dict, rng: random.Random) -> dict:
    """A drill's checks and replayed steps (its row's ``details``): the run's own model in its
    keys evidence (stored once by its content, as drill stores it), every check's time and
    every step's loss and grad norm drawn afresh."""
    checks = [
        {**c, "seconds": rng.uniform(0.001, 5), **({"evidence": model} if c["name"] == "keys" else {})}
        for c in details["checks"]
    ]
    steps = [
        {**r, "loss": r["loss"] * rng.uniform(0.9, 1.1) if isinstance(r.get("loss"), float) else r.get("loss"),
         "grad_norm": rng.uniform(0.1, 10)}
        for r in details.get("replay_steps") or []
    ]  # fmt: skip
    return {"checks": checks, "replay_steps": steps}


def _drill(template: dict, drill_id: int, run: int, ckpt_id: int, started: datetime, rng: random.Random) -> dict:
    return {
        **template["drill"], "id": drill_id, "checkpoint_id": ckpt_id, "run_root": f"/ckpt/run-{run}",
        "selector": rng.choice(["latest", "least-recently-drilled", "random"]), "policy": f"nightly-{run}",
        "host": f"gpu-{rng.randrange(64):02d}", "pid": rng.randrange(2, 1 << 22), "started_at": started,
        "finished_at": started + timedelta(seconds=rng.uniform(10, 300)), "restore_seconds": rng.uniform(5, 50),
        "discover_seconds": rng.uniform(0.01, 1), "read_seconds": rng.uniform(1, 30), "load_seconds": rng.uniform(1, 10),
        "ttfs_seconds": rng.uniform(20, 90), "bytes_read": rng.randrange(1 << 30, 1 << 40),
        "throughput_bps": rng.uniform(1e8, 1e10), "selection": f"seed {rng.getrandbits(32)}",
    }  # fmt: skip


def build(path: Path, drills: int, by_status: dict[str, dict]) -> None:
    """``drills`` varied records over the last year, sealed into the chain."""
    from sqlalchemy import insert

    from drill.records.audit import load_audit_key, seal_drills
    from drill.records.db import open_database
    from drill.records.models import Checkpoint, Drill
    from drill.records.rows import stored_evidence

    database = open_database(f"sqlite:///{path}")
    now, rng = datetime.now(timezone.utc), random.Random(0)
    with database.sessions.begin() as s:
        models = {  # each run's model, stored once (drill.records.rows.stored_evidence)
            (run, status): stored_evidence(s, _model_of(run, keys[0]["evidence"]))
            for run in range(RUNS)
            for status, t in by_status.items()
            if (keys := [c for c in t["drill"]["details"]["checks"] if c["name"] == "keys"])
        }
        ckpts = []
        for run in range(RUNS):
            for day in range(DAYS):
                seen = now - timedelta(days=DAYS - day)
                ckpts.append({**by_status["passed"]["checkpoint"], "run_root": f"/ckpt/run-{run}", "uri": f"/ckpt/run-{run}/step-{day * 1000}",
                              "step": day * 1000, "first_seen": seen, "last_seen": seen})  # fmt: skip
        for c in ckpts:
            c.pop("id")
        s.execute(insert(Checkpoint.__table__), ckpts)
        for first in range(0, drills, 5000):
            d_rows = []
            for i in range(first, min(drills, first + 5000)):
                run = rng.randrange(RUNS)
                started = now - timedelta(seconds=(drills - i) * DAYS * 86400 / drills)
                day = min(DAYS - 1, max(0, DAYS - 1 - (now - started).days))
                draw = rng.randrange(ERROR_EVERY)
                status = (
                    "error"
                    if draw == 0 and "error" in by_status
                    else "failed"
                    if draw < ERROR_EVERY // FAILED_EVERY
                    else "passed"
                )
                t = by_status[status]
                row = _drill(t, i + 1, run, run * DAYS + day + 1, started, rng)
                row["details"] = _details(t["drill"]["details"], models.get((run, status), {}), rng)
                d_rows.append(row)
            s.execute(insert(Drill.__table__), d_rows)
        seal_drills(s, list(range(1, drills + 1)), load_audit_key())
    database.close()


ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
"""As an installed drill runs: with its modules' bytecode cached (a warm-up run writes it)."""


LAUNCH = r"""
import os, sys, time, json
t = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
print(json.dumps({"seconds": time.perf_counter() - t, "peak_bytes": usage.ru_maxrss * 1024, "code": os.waitstatus_to_exitcode(status)}))
"""
"""Each command is started from this small launcher, not from the benchmark: a child forked
from a large process reports that process's memory as its own peak (Linux keeps the high-water
mark across exec). The peak is the largest of the command's processes (its workers included)."""


LIMIT = r"""
import hashlib, os, sys
from concurrent.futures import ProcessPoolExecutor
path = sys.argv[1]
size = os.path.getsize(path)
n = len(os.sched_getaffinity(0))
def part(i):
    h, fd = hashlib.sha256(), os.open(path, os.O_RDONLY)
    start, end = size * i // n, size * (i + 1) // n
    while start < end:
        chunk = os.pread(fd, min(1 << 20, end - start), start)
        h.update(chunk)
        start += len(chunk)
    return h.hexdigest()
with ProcessPoolExecutor(n) as pool:
    list(pool.map(part, range(n)))
"""
"""The limit: every byte of the database file read and SHA-256'd, a share per core."""


def measure(cmd: list[str], repeat: int = 3, warm: bool = True) -> dict[str, float]:
    """Median wall seconds and the largest peak RSS of ``cmd`` over ``repeat`` fresh processes
    (after one warm-up run, with ``warm``)."""
    walls, peaks = [], []
    if warm:
        subprocess.run(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", LAUNCH, *cmd], env=ENV, capture_output=True, text=True).stdout
        got = json.loads(out.strip().splitlines()[-1])
        if got["code"] != 0:
            raise SystemExit(f"{' '.join(cmd)} exited {got['code']}")
        walls.append(got["seconds"])
        peaks.append(got["peak_bytes"])
    return {"seconds": statistics.median(walls), "peak_bytes": max(peaks)}


def one_size(drills: int, rows: dict, cache: Path) -> dict:
    path = cache / f"drill-records-v{LAYOUT}-{drills}.db"
    if not path.exists():
        started = time.perf_counter()
        tmp = path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        build(tmp, drills, rows)
        with sqlite3.connect(tmp) as c:  # fold the write-ahead log in: it does not follow a rename
            c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        c.close()
        tmp.rename(path)
        print(f"built {drills} drills in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    db = ["--db", f"sqlite:///{path}"]
    with tempfile.TemporaryDirectory() as tmp:
        return {
            "baseline: import drill.cli.app": measure([sys.executable, "-c", "import drill.cli.app"]),
            "limit: hash the database file": measure([sys.executable, "-c", LIMIT, str(path)]),
            "audit verify": measure(["drill", "audit", "verify", *db]),
            "metrics": measure(["drill", "metrics", "--textfile", f"{tmp}/drill.prom", "--no-list", *db]),
            "report 30d html": measure(
                ["drill", "report", "--since", "30d", "-f", "html", "-o", f"{tmp}/r.html", "--no-list", *db]
            ),
            "database bytes": {"seconds": 0.0, "peak_bytes": path.stat().st_size},
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--drills", default="2000,20000,200000")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cache = Path(os.environ.get("TMPDIR", tempfile.gettempdir()))
    with tempfile.TemporaryDirectory(prefix="drill-records-") as tmp:
        rows = templates(Path(tmp))
    figures = {int(n): one_size(int(n), rows, cache) for n in args.drills.split(",")}
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for n, got in figures.items():
        limit = got["limit: hash the database file"]["seconds"]
        print(
            f"{n:,} drills ({got['database bytes']['peak_bytes'] / 1e6:,.0f} MB database; median of 3 fresh processes)"
        )
        for name, m in got.items():
            if name == "database bytes":
                continue
            print(
                f"  {name:<32} {m['seconds']:6.2f} s  ({m['seconds'] / limit:5.2f}× the limit)  peak {m['peak_bytes'] / 1e6:6.0f} MB"
            )


if __name__ == "__main__":
    main()
