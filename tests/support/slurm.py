"""A real single-node Slurm cluster on 127.0.0.1 for the tests: munged, slurmctld, slurmd.

Everything lives under one temporary directory (config, state, spool, logs, munge's socket
and key); the daemons run in the foreground as children of this process and are stopped by
pid. Needs Debian's ``slurm-wlm munge``; :func:`available` says whether they are installed.
Clients find the cluster through ``$SLURM_CONF`` (see :meth:`SlurmCluster.env`).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tests.support.s3server import free_port

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol")

CONF = """\
ClusterName=drilltest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
AuthInfo=socket={d}/munge/munge.socket
CredType=cred/munge
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
MinJobAge=600
KillWait=5
NodeName=localhost NodeAddr=127.0.0.1 CPUs=8 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
PartitionName=drained Nodes=localhost Default=NO MaxTime=INFINITE State=DOWN
PartitionName=short Nodes=localhost Default=NO MaxTime=1 State=UP
"""


def available() -> bool:
    return all(shutil.which(b) for b in BINARIES)


class SlurmCluster:
    """``with SlurmCluster() as slurm:`` → ``slurm.env`` for sbatch, squeue, scontrol."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="drill-slurm-"))
        self.conf = self.dir / "slurm.conf"
        self.procs: list[subprocess.Popen] = []

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def __enter__(self) -> SlurmCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        d = self.dir
        for sub in ("state", "spool", "munge"):
            (d / sub).mkdir()
        self._munge()
        self.conf.write_text(CONF.format(d=d, ctld_port=free_port(), slurmd_port=free_port()))
        self._daemon(["slurmctld", "-D", "-f", str(self.conf)])
        self._daemon(["slurmd", "-D", "-N", "localhost", "-f", str(self.conf)])
        self._wait_idle()

    def _munge(self) -> None:
        """munged as user munge, its key, socket and files in our directory."""
        m = self.dir / "munge"
        os.chmod(self.dir, 0o755)  # munged (user munge) resolves paths through it
        shutil.copy("/etc/munge/munge.key", m / "munge.key")
        user = pwd.getpwnam("munge")
        for path in (m, m / "munge.key"):
            os.chown(path, user.pw_uid, user.pw_gid)
        os.chmod(m, 0o700)
        os.chmod(m / "munge.key", 0o400)
        cmd = ["runuser", "-u", "munge", "--", "munged", "-F", f"--socket={m}/munge.socket", f"--key-file={m}/munge.key",
               f"--pid-file={m}/munged.pid", f"--log-file={m}/munged.log", f"--seed-file={m}/munged.seed"]  # fmt: skip
        self._daemon(cmd)
        os.chmod(m, 0o755)  # the socket must be reachable by the clients (root here)
        deadline = time.monotonic() + 10
        while not (m / "munge.socket").exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start; see {m / 'munged.log'}")
            time.sleep(0.05)

    def _daemon(self, cmd: list[str]) -> None:
        log = open(self.dir / f"{cmd[0] if cmd[0] != 'runuser' else 'munged'}.out", "wb")
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def _wait_idle(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a Slurm daemon exited during start-up; logs in {self.dir}")
            out = subprocess.run(
                ["sinfo", "-h", "-p", "debug", "-o", "%t"],
                env={**os.environ, **self.env},
                capture_output=True,
                text=True,
            )
            if out.returncode == 0 and out.stdout.strip() in ("idle", "mix", "alloc"):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the Slurm node did not become idle within {timeout:.0f} s; logs in {self.dir}")

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
        self.procs.clear()
        if not os.environ.get("DRILL_KEEP_SLURM"):
            shutil.rmtree(self.dir, ignore_errors=True)
