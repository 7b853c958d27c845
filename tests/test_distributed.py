"""Distributed drills on real ranks: a checkpoint sharded by 4 CPU ranks (FSDP2, gloo) drilled
by 2, 3 and 1 processes launched the way srun launches them (RANK/WORLD_SIZE, a file://
rendezvous: nothing listens on a port); ranks killed and hung by failpoints."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drill import get_drill, history
from drill.checks.contract import check_dataloader, check_rng
from drill.formats.canonical import Layout
from tests.support.ranks import launch
from tests.support.ranks import start as _start

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("sharded") / "run"
    subprocess.run(
        [sys.executable, "-m", "drill", "demo", str(run), "--ranks", "4", "--steps", "20", "--save-every", "10", "--keep", "2"],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return run


def _data_files(ckpt: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in ckpt.iterdir() if p.name.endswith(".distcp")}


@pytest.mark.parametrize("world", [2, 3])
def test_a_4_rank_checkpoint_drilled_by_fewer_ranks_reads_every_byte_once(
    sharded_run: Path, tmp_path: Path, world: int
) -> None:
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    ranks = launch(world, ["--root", str(sharded_run), "--db", db, "--json", "-q"], tmp_path)
    assert [r.returncode for r in ranks] == [0] * world, [r.stderr for r in ranks]
    assert all(r.stdout == "" for r in ranks[1:])  # only rank 0 reports
    doc = json.loads(ranks[0].stdout)
    assert doc["status"] == "passed" and doc["distributed"]["world_size"] == world
    files = _data_files(sharded_run / "step-20")
    assignment = doc["distributed"]["assignment"]
    assert sorted(f for share in assignment for f in share) == sorted(files)  # every data file, exactly once
    per_rank = [sum(files[f] for f in share) for share in assignment]
    assert [r["rank"] for r in doc["distributed"]["ranks"]] == list(range(world))  # every rank reported
    checks = {c["name"]: c for c in doc["checks"]}
    read = {f["path"]: f for f in checks["files"]["evidence"]["files"]}
    assert sorted(read) == sorted([*files, ".metadata"])  # one entry per file: nothing read twice
    assert all(read[f]["bytes_read"] == files[f] for f in files)
    assert checks["integrity"]["evidence"]["bytes_verified"] == checks["integrity"]["evidence"]["bytes_listed"]
    assert checks["contract"]["status"] == "passed" and checks["contract"]["evidence"]["ranks"] == [0, 1, 2, 3]
    (finding,) = checks["replay"]["findings"]  # the newest checkpoint: the run logged nothing after it
    assert "ends at step 20: nothing after step 20 to compare" in finding["message"]
    assert finding["hint"].startswith("drill an older checkpoint")
    if world == 2:
        assert doc["distributed"]["balance"] <= 1.1 and max(per_rank) / min(per_rank) <= 1.1
    (recorded,) = history(db=db)
    assert get_drill(recorded.id, db=db).distributed["world_size"] == world


def test_a_corrupt_shard_fails_the_distributed_drill_and_is_recorded_once(sharded_run: Path, tmp_path: Path) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(sharded_run, run)
    shard = run / "step-20" / "__2_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10
    shard.write_bytes(bytes(data))
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    ranks = launch(2, ["--root", str(run), "--db", db, "-q", "--no-replay"], tmp_path)
    assert [r.returncode for r in ranks] == [1, 1]  # every rank exits with the verdict
    assert "__2_0.distcp" in ranks[0].stdout and "drill: rank 1: failed:" in ranks[1].stderr
    (recorded,) = history(db=db)
    assert recorded.status == "failed"


def _finish(procs: list[subprocess.Popen], timeout: float = 240) -> list[subprocess.CompletedProcess]:
    out = []
    for p in procs:
        o, e = p.communicate(timeout=timeout)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, o, e))
    return out


def test_a_rank_killed_mid_restore_is_named_and_recorded_once_every_time(sharded_run: Path, tmp_path: Path) -> None:
    """10 tries, side by side: each ends at once (heartbeats, not the rank timeout) as one
    `error` record naming rank 1, its host and pid, and that its process is gone."""
    tries = []
    for n in range(10):
        db = f"sqlite:///{tmp_path / f'drill-{n}.db'}"
        args = [
            "--root",
            str(sharded_run),
            "--db",
            db,
            "-q",
            "--no-replay",
            "--lost-after",
            "5",
            "--rank-timeout",
            "300",
            "--verdict-file",
            str(tmp_path / f"v{n}.json"),
        ]
        tries.append((db, n, _start(2, args, tmp_path / f"rdzv-{n}", env={"DRILL_FAILPOINTS": "restored@1=kill"})))
    for db, n, procs in tries:
        rank0, rank1 = _finish(procs)
        assert rank1.returncode == -9 and rank0.returncode == 5, (n, rank0.stderr)
        assert re.search(
            r"drill: error: rank 1 on \S+ \(pid \d+\) was lost at 'restored': no heartbeat for [\d.]+ s \(its process is gone: killed or crashed\)",
            rank0.stderr,
        ), rank0.stderr
        (recorded,) = history(db=db)
        assert recorded.status == "error" and "rank 1 on" in (recorded.message or "")
        verdict = json.loads((tmp_path / f"v{n}.json").read_text())
        assert (verdict["id"], verdict["status"], verdict["exit_code"]) == (recorded.id, "error", 5)
        seconds = float(re.search(r"no heartbeat for ([\d.]+) s", rank0.stderr).group(1))
        assert seconds < 60  # the documented bound is --lost-after plus a heartbeat; far below the rank timeout


def test_a_hung_rank_fails_the_drill_within_the_rank_timeout(sharded_run: Path, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    started = time.monotonic()
    ranks = launch(
        2,
        ["--root", str(sharded_run), "--db", db, "-q", "--rank-timeout", "8", "--timeout", "20"],
        tmp_path,
        env={"DRILL_FAILPOINTS": "restored@1=hang"},
    )
    assert (
        ranks[0].returncode == 5
        and "rank 1 did not reach 'restored' within 8 s, though alive (hung)" in ranks[0].stderr
    ), ranks[0].stderr
    assert re.search(r"rank 1 on \S+ \(pid \d+\) last reached '", ranks[0].stderr)
    assert ranks[1].returncode == 5  # its own deadline ends the hung rank
    assert time.monotonic() - started < 90
    assert history(db=db)[0].status == "error"


def test_a_rank_that_never_joins_is_named_and_recorded(sharded_run: Path, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    rank0, rank1 = _finish(
        _start(
            3,
            ["--root", str(sharded_run), "--db", db, "-q", "--no-replay", "--rank-timeout", "15"],
            tmp_path / "rdzv",
            ranks=range(0, 2),
        )
    )
    # rank 1 joined and was waited for; rank 2 was never started
    assert (
        rank0.returncode == rank1.returncode == 5
        and "rank 2 never joined: no sign of it 15 s after this rank joined" in rank0.stderr
    ), rank0.stderr
    (recorded,) = history(db=db)
    assert recorded.status == "error" and "rank 2 never joined" in (recorded.message or "")


def test_a_rank_that_fails_early_is_heard_at_once(sharded_run: Path, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    started = time.monotonic()
    args = ["--root", str(sharded_run), "--db", db, "-q", "--no-replay", "--rank-timeout", "600", "--lost-after", "600"]
    rank0, rank1 = _finish(_start(2, args, tmp_path / "rdzv", env={"DRILL_FAILPOINTS": "restored@1=raise"}))
    assert time.monotonic() - started < 120  # neither timeout was waited out
    assert rank0.returncode == rank1.returncode == 5
    assert re.search(r"rank 1 on \S+ \(pid \d+\) stopped before 'restored': .*failpoint restored", rank0.stderr), (
        rank0.stderr
    )
    assert history(db=db)[0].status == "error"


def test_when_rank_0_is_lost_rank_1_closes_its_record(sharded_run: Path, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    verdict = tmp_path / "verdict.json"
    args = [
        "--root",
        str(sharded_run),
        "--db",
        db,
        "-q",
        "--no-replay",
        "--lost-after",
        "4",
        "--verdict-file",
        str(verdict),
    ]
    rank0, rank1 = _finish(_start(2, args, tmp_path / "rdzv", env={"DRILL_FAILPOINTS": "restored@0=kill"}))
    assert rank0.returncode == -9 and rank1.returncode == 5
    (recorded,) = history(db=db)
    assert recorded.status == "error" and re.search(r"rank 0 on \S+ \(pid \d+\) was lost", recorded.message or ""), (
        recorded.message
    )
    assert json.loads(verdict.read_text())["rank"] == 1
    from typer.testing import CliRunner

    from tests.conftest import invoke

    res = invoke(CliRunner(), "verdict", str(verdict))
    assert res.exit_code == 5 and f"drill #{recorded.id} error: rank 0 on" in res.stderr
    res = invoke(CliRunner(), "verdict", str(tmp_path / "none.json"))
    assert res.exit_code == 5 and "no verdict at" in res.stderr


def _tcp_connections(pids: list[int]) -> int:
    """Established TCP connections with both ends in these processes (each counted once)."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    ends = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            ends += fields[3] == "01" and fields[9] in inodes  # 01: ESTABLISHED
    return ends // 2


def test_32_ranks_hold_o_n_connections_and_a_lost_rank_is_found_within_the_bound(
    sharded_run: Path, tmp_path: Path
) -> None:
    """The scale test: 32 ranks on one host meeting through a TCPStore (env://). While every
    rank is parked mid-drill, count the connections among them: one per rank to the store (a
    gloo mesh would hold 32·31/2 = 496). Rank 7 was killed on arrival; once released, rank 0
    names it within --lost-after plus a heartbeat."""
    from tests.support.s3server import free_port

    world, lost_after = 32, 10.0
    release = tmp_path / "release"
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1",
           "DRILL_FAILPOINTS": "restored@7=kill,restored=hold", "DRILL_FAILPOINTS_RELEASE": str(release)}  # fmt: skip
    env.pop("DRILL_DIST_INIT", None)
    args = [
        "--root",
        str(sharded_run),
        "--db",
        db,
        "-q",
        "--no-replay",
        "--lost-after",
        str(lost_after),
        "--rank-timeout",
        "600",
        "--timeout",
        "900",
    ]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "drill", "run", *args],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    try:
        deadline = time.monotonic() + 600
        parked = [r for r in range(world) if r != 7]
        while not all(Path(f"{release}.{r}").exists() for r in parked):
            assert time.monotonic() < deadline and all(procs[r].poll() is None for r in parked), (
                "the ranks did not all reach the failpoint"
            )
            time.sleep(0.2)
        connections = _tcp_connections([p.pid for p in procs])
        port = f"{int(env['MASTER_PORT']):04X}"
        listening = {
            ln.split()[1]
            for t in ("/proc/net/tcp", "/proc/net/tcp6")
            for ln in Path(t).read_text().splitlines()[1:]
            if ln.split()[3] == "0A" and ln.split()[1].endswith(f":{port}")
        }
        assert listening == {f"0100007F:{port}"}  # the store rank 0 hosts listens on MASTER_ADDR only
        print(
            f"\n{world} ranks, {world - 1} alive: {connections} TCP connections among them (a gloo mesh: {world * (world - 1) // 2})"
        )
        assert connections <= 2 * world
        release.touch()
        results = _finish(procs, timeout=600)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert results[7].returncode == -9 and results[0].returncode == 5, results[0].stderr
    assert all(r.returncode == 5 for i, r in enumerate(results) if i != 7)
    found = re.search(
        r"rank 7 on \S+ \(pid \d+\) was lost at 'restored': no heartbeat for ([\d.]+) s", results[0].stderr
    )
    assert found, results[0].stderr
    print(
        f"rank 7 found lost after {found.group(1)} s without a heartbeat (bound: --lost-after {lost_after:g} s + one heartbeat)"
    )
    assert (
        float(found.group(1)) < lost_after + 30
    )  # generous on a loaded machine: the point is it is not the 600 s rank timeout
    (recorded,) = history(db=db)
    assert recorded.status == "error" and "rank 7 on" in (recorded.message or "")


def _isolated(command: list[str]) -> list[str]:
    """``command`` in a network namespace of its own with only loopback up: torchrun's stores
    bind every interface. Skips the test where ``unshare -n`` is not allowed."""
    import shutil

    if (
        shutil.which("unshare") is None
        or subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode != 0
    ):
        pytest.skip("unshare -n is not available: torchrun's stores would listen on every interface")
    return ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *command]


def _torchrun(args: list[str], *, ranks: int = 2, restarts: int = 0) -> list[str]:
    return _isolated(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
         "--max-restarts", str(restarts), "-m", "drill", "run", *args]
    )  # fmt: skip


def test_torchrun_max_restarts_records_each_attempt_once_and_keeps_the_exit_code(
    sharded_run: Path, tmp_path: Path
) -> None:
    """torchrun restarts the group after rank 1 dies in attempt 0: attempt 0's record is closed
    (never left running) as an error naming rank 1, attempt 1 meets in keys of its own and
    passes; torchrun's exit code is its own, the verdict file keeps drill's."""
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    verdict = tmp_path / "v.json"
    torchrun = _torchrun(
        [
            "--root",
            str(sharded_run),
            "--db",
            db,
            "-q",
            "--no-replay",
            "--lost-after",
            "5",
            "--verdict-file",
            str(verdict),
        ],
        restarts=1,
    )
    env = {**os.environ, "DRILL_FAILPOINTS": "restored@1:0=kill", "OMP_NUM_THREADS": "1"}
    res = subprocess.run(torchrun, env=env, capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    drills = sorted(history(db=db), key=lambda d: d.id)
    assert [d.status for d in drills][-1] == "passed" and all(d.status != "running" for d in drills), [
        (d.status, d.message) for d in drills
    ]
    assert len(drills) == 2 and drills[0].status == "error" and "rank 1 on" in (drills[0].message or "")
    assert drills[1].options.get("earlier_attempts") == [drills[0].id]  # one torchrun run id: the attempts are linked
    assert json.loads(verdict.read_text())["status"] == "passed"
    res = subprocess.run([sys.executable, "-m", "drill", "verdict", str(verdict)], capture_output=True, text=True)
    assert res.returncode == 0 and f"drill #{drills[1].id} passed" in res.stderr


@pytest.mark.parametrize(
    ("failpoint", "rank", "stage"),
    [("discover@1=kill", 1, "discover"), ("joining@0=hang,discover@1=kill", 1, "discover"), ("plan@1=kill", 1, "plan"), ("restored@1=kill", 1, "restore"),
     ("restored@0=kill", 0, "restore"), ("checks@0=kill", 0, "checks")],
)  # fmt: skip
def test_under_torchrun_the_rank_that_died_is_named_not_the_agents_sigterm(
    sharded_run: Path, tmp_path: Path, failpoint: str, rank: int, stage: str
) -> None:
    """torchrun's agent SIGTERMs the survivors as soon as one rank dies: the survivors ask the
    rank group who died. One record, ``error``, naming the rank, its host, pid and stage — closed
    by rank 1 when rank 0 is the one that died; never ``aborted``, never left ``running``. Killed
    at its first stage, rank 1 may die before rank 0 opened a record — even before a loaded rank 0
    joined (``joining@0=hang``): then nothing is recorded and rank 0 says who stopped it."""
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    verdict = tmp_path / "v.json"
    args = ["--root", str(sharded_run), "--db", db, "-q", "--no-replay", "--verdict-file", str(verdict)]
    env = {**os.environ, "DRILL_FAILPOINTS": failpoint, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(_torchrun(args), env=env, capture_output=True, text=True, timeout=300)
    named = rf"rank {rank} on \S+ \(pid \d+\) died at '{stage}' \(its process is gone: killed or crashed\)"
    drills = history(db=db)
    if not drills and stage == "discover":
        assert re.search(
            named + r"; its launcher then stopped this rank before the drill began \(nothing was recorded\)", res.stderr
        ), res.stderr[-3000:]
        return
    (recorded,) = drills
    assert recorded.status == "error" and re.search(named, recorded.message or ""), (
        recorded.status,
        recorded.message,
        res.stderr[-3000:],
    )
    written = json.loads(verdict.read_text())
    assert (written["id"], written["status"], written["exit_code"], written["rank"]) == (
        recorded.id,
        "error",
        5,
        1 if rank == 0 else 0,
    )


def test_under_torchrun_an_operators_sigterm_is_aborted_and_the_agents_death_is_named(
    sharded_run: Path, tmp_path: Path
) -> None:
    """Both ranks parked mid-restore. A SIGTERM to torchrun (an operator, a scheduler) reaches
    every rank alive: ``aborted``, no rank blamed. The agent SIGKILLed instead takes the store it
    hosts: rank 0 records an ``error`` naming torchrun's agent, not itself."""
    for n, (sig, parked) in enumerate([(signal.SIGTERM, "restored=hold"), (signal.SIGKILL, "restored@1=hold")]):
        db = f"sqlite:///{tmp_path / f'drill-{n}.db'}"
        release = tmp_path / f"release-{n}"
        env = {
            **os.environ,
            "DRILL_FAILPOINTS": parked,
            "DRILL_FAILPOINTS_RELEASE": str(release),
            "OMP_NUM_THREADS": "1",
        }
        args = ["--root", str(sharded_run), "--db", db, "-q", "--no-replay"]
        agent = subprocess.Popen(_torchrun(args), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            ranks = [0, 1] if sig == signal.SIGTERM else [1]
            _await_files([Path(f"{release}.{r}") for r in ranks], agent)
            agent.send_signal(sig)
            if sig == signal.SIGKILL:
                agent.wait(timeout=60)
                (recorded,) = _await_closed(db)
                release.touch()  # rank 1 goes on, finds the store gone, and leaves
            else:
                agent.communicate(timeout=120)
                (recorded,) = history(db=db)
        finally:
            release.touch()
            if agent.poll() is None:
                agent.kill()
            agent.communicate()
        if sig == signal.SIGTERM:
            assert recorded.status == "aborted" and recorded.message == "interrupted by SIGTERM during restore", (
                recorded.message
            )
        else:
            assert recorded.status == "error" and re.search(
                r"the rendezvous store went away: torchrun's agent at \S+ hosting it died or was stopped",
                recorded.message or "",
            ), recorded.message


def _await_files(files: list[Path], proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not all(f.exists() for f in files):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"never parked: {files}"
        time.sleep(0.05)


def _await_closed(db: str, timeout: float = 120) -> list:
    """The drills once none is running (rank 0 closes its record when it finds the store gone)."""
    deadline = time.monotonic() + timeout
    while True:
        drills = history(db=db)
        if drills and all(d.status != "running" for d in drills):
            return drills
        assert time.monotonic() < deadline, [(d.status, d.message) for d in drills]
        time.sleep(0.1)


def test_the_contract_wants_rng_and_loader_state_from_every_saved_rank() -> None:
    import torch

    layout = Layout(format="dcp", required=(), saved_ranks=[0, 1, 2, 3])
    rng = {f"rng.rank_{r}.{g}": torch.zeros(2) for r in (0, 1, 3) for g in ("python.state", "numpy.keys", "torch")}
    findings, evidence = check_rng(rng, layout)
    assert [(f.code, f.subject) for f in findings] == [("rng-rank-missing", "rng.rank_2")] and evidence["ranks"] == {
        0: ["numpy", "python", "torch CPU"],
        1: ["numpy", "python", "torch CPU"],
        3: ["numpy", "python", "torch CPU"],
    }
    loader = {
        f"dataloader.rank_{r}.{k}": v
        for r in (0, 1)
        for k, v in (("seed", 1), ("epoch", 0), ("position", 20), ("batch_size", 2), ("num_windows", 100))
    }
    findings, _ = check_dataloader({**loader, "train_state.step": 10}, layout, required=True)
    assert sorted(f.subject for f in findings if f.code == "dataloader-rank-missing") == [
        "dataloader.rank_2",
        "dataloader.rank_3",
    ]
    findings, _ = check_dataloader({**loader, "train_state.step": 11}, layout, required=True)
    assert sorted(f.subject for f in findings if f.code == "dataloader-step-mismatch") == [
        "dataloader.rank_0",
        "dataloader.rank_1",
    ]


# -- launchers ------------------------------------------------------------------------------
def _policy(tmp_path: Path, root: Path, allocation: str, name: str = "sharded") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"name: {name}\ncheckpoints: {{root: {root}, format: dcp}}\nreplay: {{enabled: false}}\nlimits: {{timeout: 5m}}\nallocation:\n{allocation}"
    )
    return path


def test_the_slurm_script_holds_the_allocation_and_no_password(
    sharded_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from tests.conftest import invoke

    policy = _policy(
        tmp_path,
        sharded_run,
        f"  launcher: slurm\n  nodes: 2\n  ranks_per_node: 4\n  gpus_per_node: 8\n  partition: gpu\n  account: ml\n  rendezvous: /shared/rdzv\n  log_dir: {tmp_path}\n  sbatch_args: ['--qos=low']\n",
    )
    res = invoke(
        CliRunner(), "submit", "--policy", str(policy), "--dry-run", "--db", "postgresql://drill@db.internal/drill"
    )
    assert res.exit_code == 0, res.stderr
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=8", "#SBATCH --partition=gpu", "#SBATCH --account=ml",
                 "#SBATCH --qos=low", "#SBATCH --time=15", f"#SBATCH --output={tmp_path}/drill-%j.out", "#SBATCH --open-mode=append", 'export DRILL_DIST_INIT="file://$rdzv/store"',
                 'rm -rf /shared/rdzv/drill-rdzv-"$SLURM_JOB_ID"-*', 'rdzv="$(mktemp -d /shared/rdzv/drill-rdzv-"$SLURM_JOB_ID"-"${SLURM_RESTART_COUNT:-0}"-XXXXXXXX)"',
                 "trap 'rm -rf \"$rdzv\"; exit 143' TERM", f"export DRILL_VERDICT_FILE={tmp_path}/drill-\"$SLURM_JOB_ID\".verdict.json",
                 f"-m drill verdict {tmp_path}/drill-\"$SLURM_JOB_ID\".verdict.json"):  # fmt: skip
        assert line in res.stdout, line
    assert re.search(r'export DRILL_JOB_ID="slurm:\$SLURM_JOB_ID#[0-9a-f]{8}"', res.stdout)
    assert (
        f"run --policy {policy.resolve()} --trigger policy --quiet --db postgresql+psycopg://drill@db.internal/drill"
        in res.stdout
    )
    res = invoke(
        CliRunner(), "submit", "--policy", str(policy), "--dry-run", "--db", "postgresql://drill:s3cret@db/drill"
    )
    assert res.exit_code == 2 and "must not" in res.stderr and "s3cret" not in res.stderr + res.stdout
    monkeypatch.setenv("DRILL_DATABASE_URL", "postgresql://drill:s3cret@db/drill")
    res = invoke(CliRunner(), "submit", "--policy", str(policy), "--dry-run")
    assert (
        res.exit_code == 0 and "s3cret" not in res.stdout and "--db" not in res.stdout
    )  # the job inherits the variable
    bad = _policy(tmp_path, sharded_run, "  launcher: slurm\n  nodes: 2\n", name="bad")
    res = invoke(CliRunner(), "policy", "check", str(bad))
    assert res.exit_code == 2 and "allocation.rendezvous: required for more than one node" in res.stderr


def _k8s_versions() -> tuple[str, ...]:
    """Every API schema from the minimum drill claims (``MIN_VERSION``) to 1.37."""
    from drill.launch.k8s import MIN_VERSION

    low = int(MIN_VERSION.split(".")[1])
    return tuple(f"1.{minor}.0" for minor in range(low, 38))


K8S_VERSIONS = _k8s_versions()


def test_the_kubernetes_manifests_run_on_a_real_cluster(sharded_run: Path, tmp_path: Path) -> None:
    """Every manifest — Job and CronJob, PVC and hostPath, S3 — validates against the API schema
    of each supported version, strict (no field the API does not know), and the pods pass the
    restricted Pod Security level (hostPath alone cannot: the checker says so)."""
    import yaml
    from typer.testing import CliRunner

    from drill.launch.pss import restricted_violations
    from tests.conftest import invoke

    kv = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed (pip install '.[dev]')"
    )
    base = "  launcher: k8s\n  nodes: 4\n  ranks_per_node: 8\n  gpus_per_node: 8\n  image: registry.internal/drill:0.3\n  namespace: training\n"
    pvc = _policy(tmp_path, sharded_run, base + "  volume_claim: checkpoints\n  memory: 64GiB\n", name="Sharded_Run")
    text = pvc.read_text() + "schedule: {cron: '0 3 * * *', timezone: Europe/Paris}\n"
    pvc.write_text(text)
    s3 = tmp_path / "s3.yaml"
    s3.write_text(
        f"name: s3run\ncheckpoints: {{root: s3://bucket/run7, format: dcp}}\nreplay: {{enabled: false}}\nallocation:\n{base}  s3_secret: drill-s3\n"
    )
    host = _policy(tmp_path, sharded_run, base + "  host_path: /mnt/checkpoints\n", name="hostpath")
    streams = {}
    for label, policy, extra in (("job", pvc, ()), ("cron", pvc, ("--cron",)), ("s3", s3, ()), ("hostpath", host, ())):
        res = invoke(CliRunner(), "submit", "--policy", str(policy), *extra)
        assert res.exit_code == 0, res.stderr
        assert "&id" not in res.stdout and "*id" not in res.stdout  # plain YAML: no anchors
        streams[label] = list(yaml.safe_load_all(res.stdout))
        for doc in streams[label]:
            for version in K8S_VERSIONS:
                kv.validate(doc, version, strict=True)  # raises on any field the API does not know
    config, service, job = streams["job"]
    assert [config["kind"], service["kind"], job["kind"]] == ["ConfigMap", "Service", "Job"] and config["data"][
        "policy.yaml"
    ] == text
    assert (
        re.fullmatch(r"drill-sharded-run-[0-9a-f]{8}-[0-9a-f]{6}", job["metadata"]["name"])  # its name has a '_'
        and job["metadata"]["namespace"] == "training"
    )
    again = yaml.safe_load_all(invoke(CliRunner(), "submit", "--policy", str(pvc)).stdout)
    assert list(again)[2]["metadata"]["name"] != job["metadata"]["name"]  # tonight's Job never blocks tomorrow's
    spec = job["spec"]
    assert (
        spec["completionMode"] == "Indexed"
        and spec["completions"] == spec["parallelism"] == 4
        and "activeDeadlineSeconds" not in spec
    )
    pod = spec["template"]["spec"]
    assert restricted_violations(pod) == []
    (container,) = pod["containers"]
    assert (
        pod["activeDeadlineSeconds"] == 900
        and pod["subdomain"] == service["metadata"]["name"] == job["metadata"]["name"][:-7]
    )
    assert container["resources"] == {
        "requests": {"cpu": "8", "memory": "65536Mi"},
        "limits": {"memory": "65536Mi", "nvidia.com/gpu": "8"},
    }
    # pods asking for GPUs tolerate the taint GPU pools carry, or they would never schedule there
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert (
        "--node-rank=$(JOB_COMPLETION_INDEX)" in container["command"]
        and f"--master-addr=$(JOB_NAME)-0.{service['metadata']['name']}" in container["command"]
    )
    assert {
        "name": "DRILL_DATABASE_URL",
        "valueFrom": {"secretKeyRef": {"name": "drill-database", "key": "url"}},
    } in container["env"]
    assert {"name": "checkpoints", "mountPath": str(sharded_run), "readOnly": True} in container["volumeMounts"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "checkpoints", "readOnly": True}} in pod[
        "volumes"
    ]
    cron = streams["cron"][2]
    assert (
        cron["kind"] == "CronJob"
        and cron["spec"]["schedule"] == "0 3 * * *"
        and cron["spec"]["timeZone"] == "Europe/Paris"
    )
    assert (
        cron["spec"]["concurrencyPolicy"] == "Forbid"
        and restricted_violations(cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]) == []
    )
    s3_pod = streams["s3"][2]["spec"]["template"]["spec"]
    assert (
        s3_pod["containers"][0]["envFrom"] == [{"secretRef": {"name": "drill-s3"}}]
        and restricted_violations(s3_pod) == []
    )
    assert restricted_violations(streams["hostpath"][2]["spec"]["template"]["spec"]) == [
        "volume checkpoints: hostPath (/mnt/checkpoints) is not allowed (only at the privileged level)"
    ]
    # what a cluster would refuse is refused here first
    for bad, why in (
        (base, "allocation.volume_claim: required for k8s with a filesystem root"),
        (base + "  run_as_user: 0\n", "run_as_user: must be a non-root uid"),
    ):
        res = invoke(CliRunner(), "policy", "check", str(_policy(tmp_path, sharded_run, bad, name="bad")))
        assert res.exit_code == 2 and why in res.stderr, res.stderr
    res = invoke(CliRunner(), "submit", "--policy", str(s3), "--cron")
    assert res.exit_code == 2 and "has no schedule" in res.stderr


@pytest.fixture(scope="module")
def slurm_cluster():
    from tests.support.slurm import SlurmCluster, available

    if not available():
        pytest.skip("Slurm is not installed (Debian: apt-get install slurm-wlm munge)")
    with SlurmCluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def slurm_nodes():
    """Three Slurm nodes on this host, each in namespaces of its own (host names n1–n3)."""
    from tests.support.slurm import NodesCluster, available

    if not available():
        pytest.skip("Slurm is not installed (Debian: apt-get install slurm-wlm munge)")
    why = NodesCluster.possible()
    if why:
        pytest.skip(f"several Slurm nodes on one host: {why}")
    with NodesCluster(3) as cluster:
        yield cluster


def _await_running(db: str, tmp_path: Path, proc: subprocess.Popen, timeout: float = 180) -> list:
    deadline = time.monotonic() + timeout
    while not ((tmp_path / "drill.db").exists() and [d for d in history(db=db) if d.status == "running"]):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.2)
    return history(db=db)


def test_on_two_slurm_nodes_a_killed_rank_is_named_with_its_node(
    sharded_run: Path, tmp_path: Path, slurm_nodes
) -> None:
    """Rank 1 on node n2 is killed mid-restore; srun ends the step. Rank 0, on n1, cannot see
    n2's processes: the rank group's heartbeats say rank 1 died — one ``error`` record naming
    rank 1, its node and stage."""
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    policy = _policy(
        tmp_path,
        sharded_run,
        f"  launcher: slurm\n  nodes: 2\n  ranks_per_node: 1\n  log_dir: {tmp_path}\n  rendezvous: {tmp_path}\n",
    )
    proc = _submit_process(policy, db, slurm_nodes, env={"DRILL_FAILPOINTS": "restored@1=kill"})
    _, err = proc.communicate(timeout=300)
    drills = history(db=db) if (tmp_path / "drill.db").exists() else []
    assert len(drills) == 1, err
    (recorded,) = drills
    assert recorded.status == "error" and re.search(r"rank 1 on n2 \(pid \d+\) died at 'restore'", recorded.message or ""), (
        recorded.status, recorded.message, err,
    )  # fmt: skip
    assert recorded.host == "n1" and proc.returncode == 5


def test_a_node_set_down_mid_job_requeues_it_and_the_attempts_are_linked(
    sharded_run: Path, tmp_path: Path, slurm_nodes
) -> None:
    """A node of the job is set DOWN while the drill runs: Slurm requeues the job (one job id) and
    runs it again on the nodes left. The first attempt's record is closed, the second names it,
    and ``drill submit`` exits with the second's verdict."""
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    policy = _policy(
        tmp_path,
        sharded_run,
        f"  launcher: slurm\n  nodes: 2\n  ranks_per_node: 1\n  log_dir: {tmp_path}\n  rendezvous: {tmp_path}\n",
    )
    proc = _submit_process(policy, db, slurm_nodes, env={"DRILL_FAILPOINTS": "restored@1:0=hang"})
    (first,) = _await_running(db, tmp_path, proc)
    job = first.job_id.split(":")[1].split("#")[0]
    nodes = slurm_nodes.run("squeue", "-h", "-j", job, "-o", "%N").stdout.strip()
    down = "n2" if "n2" in nodes or "[1-2]" in nodes else "n3"
    try:
        slurm_nodes.run("scontrol", "update", f"nodename={down}", "state=down", "reason=drill-test")
        slurm_nodes.run("scontrol", "update", f"nodename={down}", "state=drain", "reason=drill-test")  # kept out
        deadline = time.monotonic() + 120
        while "PENDING" not in slurm_nodes.run("squeue", "-h", "-j", job, "-o", "%T").stdout:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        slurm_nodes.run("scontrol", "update", f"JobId={job}", "StartTime=now")  # no two-minute requeue hold here
        _, err = proc.communicate(timeout=300)
    finally:
        slurm_nodes.run("scontrol", "update", f"nodename={down}", "state=resume")
    drills = sorted(history(db=db), key=lambda d: d.id)
    output = (tmp_path / f"drill-{job}.out").read_text()[-3000:] if (tmp_path / f"drill-{job}.out").exists() else ""
    state = slurm_nodes.run("scontrol", "show", "job", job).stdout
    assert len(drills) == 2, (proc.returncode, [(d.status, d.message) for d in drills], err[-3000:], output, state)
    earlier, last = drills
    assert earlier.id == first.id and earlier.status in ("aborted", "error"), (earlier.status, earlier.message)
    assert last.status == "passed" and last.job_id == first.job_id, (last.message, err)
    assert down not in {r["host"] for r in last.distributed["ranks"]}, last.distributed["ranks"]
    assert last.options.get("earlier_attempts") == [first.id] and proc.returncode == 0, err


def _submit(policy: Path, db: str, monkeypatch: pytest.MonkeyPatch, slurm, *extra: str):
    from typer.testing import CliRunner

    from tests.conftest import invoke

    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    return invoke(CliRunner(), "submit", "--policy", str(policy), "--db", db, *extra)


def test_a_real_slurm_job_drills_the_sharded_checkpoint_on_two_ranks(
    sharded_run: Path, tmp_path: Path, slurm_cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    policy = _policy(
        tmp_path,
        sharded_run,
        f"  launcher: slurm\n  ranks_per_node: 2\n  partition: debug\n  log_dir: {tmp_path}\n  sbatch_args: ['--chdir=/']\n",
    )
    monkeypatch.chdir(tmp_path)  # a relative policy path, and a job that runs elsewhere
    res = _submit(Path(policy.name), db, monkeypatch, slurm_cluster, "--json")
    assert res.exit_code == 0, res.stderr + res.stdout
    doc = json.loads(res.stdout)
    assert (
        doc["status"] == "passed"
        and re.fullmatch(r"slurm:\d+#[0-9a-f]{8}", doc["job_id"])
        and doc["distributed"]["world_size"] == 2
    )
    assert (
        re.search(r"drill: submitted slurm job \d+ \(output: .*/drill-\d+\.out\)", res.stderr)
        and "running" in res.stderr
    )
    assert get_drill(doc["id"], db=db).job_id == doc["job_id"]
    slurm_id = doc["job_id"][6:].split("#")[0]
    assert json.loads((tmp_path / f"drill-{slurm_id}.verdict.json").read_text())["id"] == doc["id"]
    assert not list(Path("/tmp").glob(f"drill-rdzv-{slurm_id}-*"))  # the rendezvous is gone with the job


def test_a_stale_rendezvous_or_record_of_a_reused_job_id_decides_nothing(
    sharded_run: Path, tmp_path: Path, slurm_cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Job ids restart from 1 on a new cluster: every id this job could get already has a
    rendezvous holding `aborted` and a record saying `passed`. The damaged checkpoint still
    fails, recorded once, and drill submit exits 1."""
    import pickle
    import shutil
    from datetime import datetime, timezone

    import torch.distributed as dist

    from drill.pipeline.recorder import DrillStart
    from drill.records.db import open_database
    from drill.records.store import Records
    from drill.verdict import DrillStatus

    run = tmp_path / "run"
    shutil.copytree(sharded_run, run)
    shard = run / "step-20" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 0x01
    shard.write_bytes(bytes(data))
    rdzv = tmp_path / "rdzv"
    rdzv.mkdir()
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    database = open_database(db)
    records = Records(database)
    for job in range(1, 300):
        for name in (f"drill-rdzv-{job}", f"drill-rdzv-{job}-0-stale/store"):
            (rdzv / name).parent.mkdir(parents=True, exist_ok=True)
            store = dist.FileStore(str(rdzv / name), -1)
            for prefix in ("drill/", f"drill/{job}/0/"):
                dist.PrefixStore(prefix, store).set("published/verdict", pickle.dumps((None, "aborted", 143, "stale")))
        start = DrillStart(
            run_root=str(run),
            selector="latest",
            trigger="policy",
            device="cpu",
            policy="sharded",
            started_at=datetime.now(timezone.utc),
            versions={"drill": "0"},
            job_id=f"slurm:{job}",
        )
        records.record_lost(start, status=DrillStatus.PASSED, exit_code=0, reason="a drill of another cluster")
    database.close()
    policy = _policy(
        tmp_path, run, f"  launcher: slurm\n  ranks_per_node: 2\n  rendezvous: {rdzv}\n  log_dir: {tmp_path}\n"
    )
    res = _submit(policy, db, monkeypatch, slurm_cluster)
    assert res.exit_code == 1, res.stderr
    mine = [d for d in history(db=db, limit=1000) if d.job_id and "#" in d.job_id]
    assert [d.status for d in mine] == ["failed"] and "__1_0.distcp" in (mine[0].message or "") + res.stdout
    assert all(d.status == "passed" for d in history(db=db, limit=1000) if d not in mine)


def test_a_job_that_can_never_run_fails_within_a_minute(
    sharded_run: Path, tmp_path: Path, slurm_cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    policy = _policy(
        tmp_path, sharded_run, f"  launcher: slurm\n  partition: short\n  queue_timeout: 1h\n  log_dir: {tmp_path}\n"
    )  # asks 15 min of a 1 min partition
    started = time.monotonic()
    res = _submit(policy, db, monkeypatch, slurm_cluster)
    assert time.monotonic() - started < 60
    assert res.exit_code == 5 and re.search(
        r"can never run as asked \(Slurm's reason: Partition(Config|TimeLimit)\)", res.stderr
    ), res.stderr
    (recorded,) = history(db=db)
    assert recorded.status == "error" and "job output" not in (recorded.message or "")  # it never ran: none was written
    from drill import __version__

    versions = get_drill(recorded.id, db=db).versions
    assert versions["drill"] == __version__ and versions["torch"]


def test_slurm_refusing_the_job_is_recorded(
    sharded_run: Path, tmp_path: Path, slurm_cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    policy = _policy(tmp_path, sharded_run, f"  launcher: slurm\n  partition: nope\n  log_dir: {tmp_path}\n")
    res = _submit(policy, db, monkeypatch, slurm_cluster)
    assert res.exit_code == 5 and "slurm refused the job: invalid partition specified: nope" in res.stderr
    (recorded,) = history(db=db)
    assert recorded.status == "error" and recorded.policy == "sharded"


def test_a_job_stuck_in_the_queue_is_cancelled_and_recorded(
    sharded_run: Path, tmp_path: Path, slurm_cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    policy = _policy(
        tmp_path, sharded_run, f"  launcher: slurm\n  partition: drained\n  queue_timeout: 3s\n  log_dir: {tmp_path}\n"
    )
    res = _submit(policy, db, monkeypatch, slurm_cluster)
    assert res.exit_code == 5 and "still pending after 3 s (Slurm's reason: PartitionDown)" in res.stderr
    (recorded,) = history(db=db)
    assert recorded.status == "error" and recorded.job_id and recorded.job_id.startswith("slurm:")


def test_a_job_killed_under_the_drill_closes_its_record(
    sharded_run: Path, tmp_path: Path, slurm_cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    db = f"sqlite:///{tmp_path / 'drill.db'}"
    policy = _policy(tmp_path, sharded_run, f"  launcher: slurm\n  ranks_per_node: 2\n  log_dir: {tmp_path}\n")
    monkeypatch.setenv("DRILL_FAILPOINTS", "restored@1=hang")  # sbatch passes the environment to the job

    def cancel_when_running() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            running = [d for d in history(db=db) if d.status == "running"] if (tmp_path / "drill.db").exists() else []
            if running:
                subprocess.run(
                    ["scancel", running[0].job_id.split(":")[1].split("#")[0]],
                    env={**os.environ, **slurm_cluster.env},
                    check=False,
                )
                return
            time.sleep(0.5)

    killer = threading.Thread(target=cancel_when_running)
    killer.start()
    res = _submit(policy, db, monkeypatch, slurm_cluster)
    killer.join()
    # scancel sends SIGTERM first: the drill records itself aborted; had it been killed
    # outright, drill submit would have closed its record as an error. Never left running.
    assert "slurm job" in res.stderr and "ended CANCELLED" in res.stderr
    (recorded,) = history(db=db)
    assert (res.exit_code, recorded.status) in ((143, "aborted"), (5, "error")), (
        res.exit_code,
        recorded.status,
        recorded.message,
    )
    assert "SIGTERM" in (recorded.message or "") or "ended CANCELLED" in (recorded.message or "")


def _submit_process(policy: Path, db: str, slurm, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([*slurm.client, sys.executable, "-m", "drill", "submit", "--policy", str(policy), "--db", db],
                            env={**os.environ, **slurm.env, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def _queue(slurm) -> str:
    return subprocess.run(
        ["squeue", "-h", "-o", "%i %T"], env={**os.environ, **slurm.env}, capture_output=True, text=True
    ).stdout


def _pending_job(sharded_run: Path, tmp_path: Path, db: str, slurm) -> tuple[subprocess.Popen, str]:
    """``drill submit`` of a job that stays pending (a drained partition), once it says so; its id."""
    policy = _policy(
        tmp_path, sharded_run, f"  launcher: slurm\n  partition: drained\n  queue_timeout: 1h\n  log_dir: {tmp_path}\n"
    )
    proc = _submit_process(policy, db, slurm)
    assert proc.stderr is not None
    for line in proc.stderr:  # the event: drill submit says the job is pending
        if ": pending" in line:
            break
    return proc, re.search(r"slurm job (\d+)", line).group(1)


def test_ctrl_c_on_submit_cancels_a_pending_job_and_records_it_aborted(
    sharded_run: Path, tmp_path: Path, slurm_cluster
) -> None:
    import signal

    db = f"sqlite:///{tmp_path / 'drill.db'}"
    proc, job = _pending_job(sharded_run, tmp_path, db, slurm_cluster)
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    (recorded,) = history(db=db)
    assert (
        recorded.status == "aborted"
        and f"drill submit was interrupted (SIGINT): slurm job {job} was cancelled while pending"
        in (recorded.message or "")
    )
    assert job not in _queue(slurm_cluster)


def test_ctrl_c_on_submit_cancels_a_running_job_whose_drill_records_itself_aborted(
    sharded_run: Path, tmp_path: Path, slurm_cluster
) -> None:
    import signal

    db = f"sqlite:///{tmp_path / 'drill.db'}"
    policy = _policy(tmp_path, sharded_run, f"  launcher: slurm\n  ranks_per_node: 2\n  log_dir: {tmp_path}\n")
    proc = _submit_process(policy, db, slurm_cluster, env={"DRILL_FAILPOINTS": "restored@1=hang"})
    deadline = time.monotonic() + 180
    while not ((tmp_path / "drill.db").exists() and [d for d in history(db=db) if d.status == "running"]):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    (recorded,) = history(db=db)
    assert recorded.status == "aborted", (recorded.status, recorded.message, err)
    assert proc.returncode == recorded.exit_code and proc.returncode in (130, 143)
    assert not _queue(slurm_cluster).strip()


def test_an_operators_scancel_of_a_pending_job_is_aborted_not_by_drill(
    sharded_run: Path, tmp_path: Path, slurm_cluster
) -> None:
    """Someone else's ``scancel`` is not a failure of the drill, and a job that never ran wrote
    no output to point at: ``aborted``, saying drill did not cancel it (and who did, where Slurm's
    accounting knows)."""
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    proc, job = _pending_job(sharded_run, tmp_path, db, slurm_cluster)
    subprocess.run(["scancel", job], env={**os.environ, **slurm_cluster.env}, check=True)
    _, err = proc.communicate(timeout=120)
    (recorded,) = history(db=db)
    assert recorded.status == "aborted" and re.search(
        rf"slurm job {job} was cancelled while pending, not by drill \(cancelled by \S+", recorded.message or ""
    ), (recorded.message, err)
    assert "job output" not in (recorded.message or "") and proc.returncode == 143


def test_a_requeued_job_links_its_attempts_and_submit_exits_with_the_last(
    sharded_run: Path, tmp_path: Path, slurm_cluster
) -> None:
    """Slurm requeues a running job (a node lost, an administrator's ``scontrol requeue``): the
    same job id runs the drill again. The first attempt's record is closed, never left running;
    the second names it as its earlier attempt; ``drill submit`` exits with the last verdict."""
    env = {**os.environ, **slurm_cluster.env}
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    policy = _policy(tmp_path, sharded_run, f"  launcher: slurm\n  ranks_per_node: 2\n  log_dir: {tmp_path}\n")
    proc = _submit_process(policy, db, slurm_cluster, env={"DRILL_FAILPOINTS": "restored@1:0=hang"})
    (first,) = _await_running(db, tmp_path, proc)
    deadline = time.monotonic() + 180
    job = first.job_id.split(":")[1].split("#")[0]
    subprocess.run(["scontrol", "requeue", job], env=env, check=True)
    while "PENDING" not in _queue(slurm_cluster):  # requeued jobs wait two minutes to start again: not here
        assert time.monotonic() < deadline, _queue(slurm_cluster)
        time.sleep(0.2)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], env=env, check=True)
    _, err = proc.communicate(timeout=300)
    drills = sorted(history(db=db), key=lambda d: d.id)
    assert len(drills) == 2, (err, [(d.status, d.message) for d in drills])
    earlier, last = drills
    assert earlier.id == first.id and earlier.status == "aborted", (earlier.status, earlier.message)
    assert last.status == "passed" and last.job_id == first.job_id, (last.status, last.message, err)
    assert last.options.get("earlier_attempts") == [first.id] and last.options.get("attempt") == 2
    assert proc.returncode == 0, err


def test_a_scheduler_stopping_cancels_its_pending_job_and_records_it(
    sharded_run: Path, tmp_path: Path, slurm_cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from drill.policy import load_policy
    from drill.records.db import open_database
    from drill.records.store import Records
    from drill.scheduling.isolate import run_policy_drill

    monkeypatch.setenv("SLURM_CONF", slurm_cluster.env["SLURM_CONF"])
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    policy = load_policy(
        _policy(
            tmp_path,
            sharded_run,
            f"  launcher: slurm\n  partition: drained\n  queue_timeout: 1h\n  log_dir: {tmp_path}\n",
        )
    )
    stopping, results = threading.Event(), []
    database = open_database(db)
    worker = threading.Thread(
        target=lambda: results.append(
            run_policy_drill(policy, db, Records(database), trigger="scheduler", stopping=stopping)
        )
    )
    worker.start()
    deadline = time.monotonic() + 60
    while "PENDING" not in _queue(slurm_cluster):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    stopping.set()  # what SIGTERM to the scheduler does
    worker.join(120)
    database.close()
    (result,) = results
    assert (
        result.status == "aborted"
        and result.exit_code == 143
        and "the scheduler stopped (SIGTERM) before the job started" in (result.message or "")
    )
    assert not _queue(slurm_cluster).strip()
    assert [d.status for d in history(db=db)] == ["aborted"]


def test_the_scheduler_submits_a_slurm_policy(
    sharded_run: Path, tmp_path: Path, slurm_cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    from drill.policy import load_policy
    from drill.records.db import open_database
    from drill.records.store import Records
    from drill.scheduling.isolate import run_policy_drill

    monkeypatch.setenv("SLURM_CONF", slurm_cluster.env["SLURM_CONF"])
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    policy = load_policy(
        _policy(tmp_path, sharded_run, f"  launcher: slurm\n  ranks_per_node: 2\n  log_dir: {tmp_path}\n")
    )
    database = open_database(db)
    try:
        result = run_policy_drill(policy, db, Records(database), trigger="scheduler")
    finally:
        database.close()
    assert (
        result.status == "passed"
        and result.document["job_id"].startswith("slurm:")
        and result.document["trigger"] == "scheduler"
    )


def test_on_a_gpu_node_each_rank_restores_onto_its_own_device(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from drill.cli.ranks import local_device as _local_device
    from drill.pipeline import DrillRequest

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert _local_device(DrillRequest(root="/r")).device == "cuda:3"
    assert _local_device(DrillRequest(root="/r", device="cpu")).device == "cpu"  # an explicit device wins
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    assert _local_device(DrillRequest(root="/r", device="cuda")).device == "cuda:1"


def test_a_large_job_on_a_file_rendezvous_beats_less_often(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every FileStore operation reads what all ranks appended since: above 64 ranks the
    heartbeat slows to world/64 s and a rank counts as lost after 5 missed beats (env:// — a
    TCPStore — keeps the 1 s beat at any width)."""
    from drill.dist.context import connect

    monkeypatch.setenv("DRILL_DIST_INIT", f"file://{tmp_path}/store")
    for world, interval, lost in ((32, 1.0, 15.0), (1024, 16.0, 80.0)):
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", str(world))
        ctx = connect(600, lost_after=15.0)
        assert ctx is not None
        try:
            assert (ctx.heartbeat.interval, ctx.lost_after, ctx.watch.lost_after) == (interval, lost, lost)
        finally:
            ctx.close()


def test_kubernetes_pods_land_on_the_gpu_pool_the_policy_names(sharded_run: Path, tmp_path: Path) -> None:
    """Node selector, tolerations and the GPU resource come from the policy, validated to the
    API's grammar before anything is rendered; the rendered pods validate on every supported version."""
    import yaml
    from typer.testing import CliRunner

    from tests.conftest import invoke

    kv = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed (pip install '.[dev]')"
    )
    base = "  launcher: k8s\n  gpus_per_node: 4\n  image: registry.internal/drill:0.3\n  volume_claim: checkpoints\n"
    pool = (
        base
        + "  gpu_resource: amd.com/gpu\n  node_selector: {pool.example.com/name: mi300x, kubernetes.io/arch: amd64}\n"
        "  tolerations:\n    - {key: dedicated, operator: Equal, value: training, effect: NoSchedule}\n"
        "    - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 60}\n"
    )
    res = invoke(CliRunner(), "submit", "--policy", str(_policy(tmp_path, sharded_run, pool, name="pool")))
    assert res.exit_code == 0, res.stderr
    job = list(yaml.safe_load_all(res.stdout))[2]
    for version in K8S_VERSIONS:
        kv.validate(job, version, strict=True)
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool.example.com/name": "mi300x", "kubernetes.io/arch": "amd64"}
    assert pod["tolerations"][-1] == {"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert (
        pod["tolerations"][0]["value"] == "training"
        and pod["containers"][0]["resources"]["limits"]["amd.com/gpu"] == "4"
    )
    everything = base + "  tolerations: [{operator: Exists}]\n"  # tolerates every taint: nothing added
    res = invoke(CliRunner(), "submit", "--policy", str(_policy(tmp_path, sharded_run, everything, name="all")))
    assert list(yaml.safe_load_all(res.stdout))[2]["spec"]["template"]["spec"]["tolerations"] == [
        {"operator": "Exists"}
    ]
    for bad, why in (
        ("  node_selector: {'bad key!': x}\n", "allocation.node_selector: 'bad key!'"),
        ("  node_selector: {zone: 'has space'}\n", "is not a label value"),
        ("  tolerations: [{key: gpu, effect: NoSchedul}]\n", "effect 'NoSchedul'"),
        ("  tolerations: [{key: gpu, operator: Exists, value: x}]\n", "none with operator Exists"),
        ("  tolerations: [{key: gpu, tolerationSeconds: 5}]\n", "with effect NoExecute only"),
        ("  tolerations: [{key: gpu, colour: red}]\n", "unknown field 'colour'"),
        ("  tolerations: [{value: x}]\n", "empty only with operator Exists"),
        ("  gpu_resource: gpu\n", "an extended resource name"),
    ):
        res = invoke(CliRunner(), "policy", "check", str(_policy(tmp_path, sharded_run, base + bad, name="bad")))
        assert res.exit_code == 2 and why in res.stderr, (bad, res.stderr)
