"""Records at a year of nightly drills: metrics, a 30-day report and the audit log's
verification against the number of drills recorded.

    python benchmarks/records.py [--drills 2000,20000,200000] [--json]

For each size it builds one SQLite record database: a real drill of a tiny demo run is
recorded first (its drill row, checks with their evidence, replayed steps and checkpoint are
the template), then cloned — ten runs, each with a checkpoint a day and its drills spread over
the last 365 days, one in twenty failed — and every record sealed into the audit chain
(:func:`drill.records.audit.seal_drills`). Then, each in a fresh process (what cron runs),
median of three, it measures wall seconds and peak memory (max RSS) of:

  drill metrics --textfile F           (target < 1 s and < 200 MB at every size)
  drill report --since 30d -f html     (target < 5 s and < 500 MB)
  drill audit verify                   after a full pass (``--full``): incremental (< 1 s)
  drill audit verify --full            the whole chain, for comparison (once)

and, as the baseline the ratios are against, ``python -c "import drill.cli.app"``: the
start-up every one of those commands pays. Databases are cached in $TMPDIR by size (200,000
drills take about 4 GB and 9 minutes to build here).
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

RUNS = 10
FAILED_EVERY = 20


def template(work: Path) -> dict:
    """One real drill's rows: the drill, its checks, its replayed steps, its checkpoint."""
    from sqlalchemy import create_engine, select

    from drill.records.models import Checkpoint, CheckRecord, Drill, ReplayStep

    demo, db = work / "demo", f"sqlite:///{work}/template.db"
    subprocess.run(["drill", "demo", str(demo)], check=True, capture_output=True)
    subprocess.run(["drill", "run", "--root", str(demo), "--db", db], check=True, capture_output=True)
    engine = create_engine(db)
    with engine.connect() as c:
        rows = {
            "drill": dict(c.execute(select(Drill.__table__)).mappings().one()),
            "checks": [dict(r) for r in c.execute(select(CheckRecord.__table__)).mappings()],
            "steps": [dict(r) for r in c.execute(select(ReplayStep.__table__)).mappings()],
            "checkpoint": dict(c.execute(select(Checkpoint.__table__)).mappings().one()),
        }
    engine.dispose()
    return rows


def build(path: Path, drills: int, rows: dict) -> None:
    """``drills`` records cloned from the template over the last year, sealed into the chain."""
    from sqlalchemy import insert

    from drill.records.audit import load_audit_key, seal_drills
    from drill.records.db import open_database
    from drill.records.models import Checkpoint, CheckRecord, Drill, ReplayStep

    database = open_database(f"sqlite:///{path}")
    now, rng = datetime.now(timezone.utc), random.Random(0)
    per_run = drills // RUNS
    days = 365
    with database.sessions.begin() as s:
        ckpts = []
        for run in range(RUNS):
            root = f"/runs/run-{run}"
            for day in range(days):
                ckpts.append({**rows["checkpoint"], "id": None, "run_root": root, "uri": f"{root}/step-{day * 1000}", "step": day * 1000,
                              "first_seen": now - timedelta(days=days - day), "last_seen": now - timedelta(days=days - day)})  # fmt: skip
        for c in ckpts:
            c.pop("id")
        s.execute(insert(Checkpoint.__table__), ckpts)
        d_rows, c_rows, r_rows = [], [], []
        for i in range(drills):
            run, k = i % RUNS, i // RUNS
            started = now - timedelta(days=days) + timedelta(seconds=k * days * 86400 / max(per_run, 1))
            day = min(days - 1, int((started - (now - timedelta(days=days))).total_seconds() // 86400))
            failed = rng.randrange(FAILED_EVERY) == 0
            drill_id = i + 1
            d_rows.append({**rows["drill"], "id": drill_id, "checkpoint_id": run * days + day + 1, "run_root": f"/runs/run-{run}",
                           "policy": f"nightly-{run}", "started_at": started, "finished_at": started + timedelta(seconds=30),
                           "status": "failed" if failed else "passed", "exit_code": 1 if failed else 0,
                           "restore_seconds": rng.uniform(5, 50), "ttfs_seconds": rng.uniform(20, 90)})  # fmt: skip
            c_rows += [{**c, "id": None, "drill_id": drill_id} for c in rows["checks"]]
            r_rows += [{**r, "id": None, "drill_id": drill_id} for r in rows["steps"]]
        for r in (*c_rows, *r_rows):
            r.pop("id")
        s.execute(insert(Drill.__table__), d_rows)
        s.execute(insert(CheckRecord.__table__), c_rows)
        if r_rows:
            s.execute(insert(ReplayStep.__table__), r_rows)
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
mark across exec)."""


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
    path = cache / f"drill-records-{drills}.db"
    if not path.exists():
        started = time.perf_counter()
        tmp = path.with_suffix(".tmp")
        build(tmp, drills, rows)
        with sqlite3.connect(tmp) as c:  # fold the write-ahead log in: it does not follow a rename
            c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        c.close()
        tmp.rename(path)
        print(f"built {drills} drills in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    db = ["--db", f"sqlite:///{path}"]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["drill", "audit", "verify", "--full", *db], check=True, stdout=subprocess.DEVNULL)
        return {
            "baseline: import drill.cli.app": measure([sys.executable, "-c", "import drill.cli.app"]),
            "metrics": measure(["drill", "metrics", "--textfile", f"{tmp}/drill.prom", "--no-list", *db]),
            "report 30d html": measure(
                ["drill", "report", "--since", "30d", "-f", "html", "-o", f"{tmp}/r.html", "--no-list", *db]
            ),
            "audit verify (incremental)": measure(["drill", "audit", "verify", *db]),
            "audit verify --full": measure(
                ["drill", "audit", "verify", "--full", *db], repeat=1, warm=False
            ),  # once: minutes at 200,000
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--drills", default="2000,20000,200000")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cache = Path(os.environ.get("TMPDIR", tempfile.gettempdir()))
    with tempfile.TemporaryDirectory(prefix="drill-records-") as tmp:
        rows = template(Path(tmp))
    figures = {int(n): one_size(int(n), rows, cache) for n in args.drills.split(",")}
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for n, got in figures.items():
        base = got["baseline: import drill.cli.app"]["seconds"]
        print(f"{n:,} drills (median of 3 fresh processes)")
        for name, m in got.items():
            print(
                f"  {name:<32} {m['seconds']:6.2f} s  ({m['seconds'] / base:5.1f}× start-up)  peak {m['peak_bytes'] / 1e6:6.0f} MB"
            )


if __name__ == "__main__":
    main()
