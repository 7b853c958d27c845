"""A real single-node Slurm cluster on 127.0.0.1 for the tests: munged, slurmctld, slurmd.

Everything lives under one temporary directory (config, state, spool, logs, munge's socket
and key); the daemons run in the foreground as children of this process and are stopped by
pid. Needs Debian's ``slurm-wlm munge``; :func:`available` says whether they are installed.
Clients find the cluster through ``$SLURM_CONF`` (see :meth:`SlurmCluster.env`).
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.support.s3server import free_port

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol")

CONF = """\
ClusterName=drilltest
SlurmctldHost={ctld}
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
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
MinJobAge=600
KillWait=5
{nodes}
PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP
PartitionName=drained Nodes={names} Default=NO MaxTime=INFINITE State=DOWN
PartitionName=short Nodes={names} Default=NO MaxTime=1 State=UP
"""


def available() -> bool:
    return all(shutil.which(b) for b in BINARIES)


class SlurmCluster:
    """``with SlurmCluster() as slurm:`` → ``slurm.env`` for sbatch, squeue, scontrol."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="drill-slurm-"))
        self.conf = self.dir / "slurm.conf"
        self.procs: list[subprocess.Popen] = []

    client: list[str] = []
    """What runs a Slurm client (sbatch, squeue, drill submit) where it reaches slurmctld."""

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *cmd: str) -> subprocess.CompletedProcess:
        """A Slurm client command, where it reaches the controller."""
        return subprocess.run([*self.client, *cmd], env={**os.environ, **self.env}, capture_output=True, text=True)

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
        self.conf.write_text(
            CONF.format(
                d=d, ctld_port=free_port(), slurmd_port=free_port(), ctld="localhost(127.0.0.1)", names="localhost",
                nodes="NodeName=localhost NodeAddr=127.0.0.1 CPUs=8 RealMemory=4000 State=UNKNOWN",
            )
        )  # fmt: skip
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
                [*self.client, "sinfo", "-h", "-p", "debug", "-o", "%t"],
                env={**os.environ, **self.env},
                capture_output=True,
                text=True,
            )
            if out.returncode == 0 and out.stdout.split() and set(out.stdout.split()) <= {"idle", "mix", "alloc"}:
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
        self._teardown()
        if not os.environ.get("DRILL_KEEP_SLURM"):
            shutil.rmtree(self.dir, ignore_errors=True)

    def _teardown(self) -> None:
        """What else :meth:`start` set up, undone once the daemons are stopped."""


class NodesCluster(SlurmCluster):
    """Several Slurm nodes on this one host: each ``slurmd`` in a network and UTS namespace of
    its own (host names n1…nN, each its own address), joined by veth pairs to a bridge in the
    namespace that also runs ``slurmctld``. Nothing listens in this host's namespace; clients run
    in the controller's (:attr:`client`). Needs root, ``ip netns`` and ``unshare``."""

    def __init__(self, nodes: int = 3) -> None:
        super().__init__()
        self.nodes = [f"n{i}" for i in range(1, nodes + 1)]
        tag = secrets.token_hex(3)  # namespaces and a subnet of this cluster only
        self.ns = {name: f"drill-{tag}-{name}" for name in ["ctl", *self.nodes]}
        self.net = f"10.{100 + secrets.randbelow(100)}.{1 + secrets.randbelow(250)}"
        self.client = ["nsenter", f"--net=/run/netns/{self.ns['ctl']}", "unshare", "--mount", "sh", "-c",
                       f'mount --bind {self.dir}/hosts /etc/hosts && exec "$@"', "sh"]  # fmt: skip

    def address(self, node: str) -> str:
        return f"{self.net}.{10 + self.nodes.index(node) + 1}"

    @staticmethod
    def possible() -> str | None:
        """Why this host cannot run it (None: it can)."""
        if os.geteuid() != 0:
            return "namespaced Slurm nodes need root"
        for tool in ("ip", "nsenter", "unshare"):
            if shutil.which(tool) is None:
                return f"{tool} is not installed"
        probe = f"drill-probe-{os.getpid()}"
        if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode != 0:
            return "ip netns add is not allowed here"
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
        return None

    def start(self) -> None:
        d = self.dir
        for sub in ("state", "spool", "munge"):
            (d / sub).mkdir()
        for n in self.nodes:
            (d / "spool" / n).mkdir()
        self._network()
        self._munge()
        nodes = "\n".join(
            f"NodeName={n} NodeAddr={self.address(n)} CPUs=4 RealMemory=4000 State=UNKNOWN" for n in self.nodes
        )
        self.conf.write_text(
            CONF.format(d=d, ctld_port=6817, slurmd_port=6818, ctld=f"ctl({self.net}.1)", names=",".join(self.nodes), nodes=nodes)
        )  # fmt: skip
        self._daemon(self._in("ctl", "slurmctld", "-D", "-f", str(self.conf)))
        for n in self.nodes:
            self._daemon(self._in(n, "slurmd", "-D", "-N", n, "-f", str(self.conf)))
        self._wait_idle()

    def _in(self, name: str, *cmd: str) -> list[str]:
        """``cmd`` in ``name``'s network namespace, in a UTS namespace whose host name is ``name``."""
        return ["nsenter", f"--net=/run/netns/{self.ns[name]}", "unshare", "--uts", "--mount", "sh", "-c",
                f'mount --bind {self.dir}/hosts /etc/hosts && hostname {name} && exec "$@"', "sh", *cmd]  # fmt: skip

    def _network(self) -> None:
        ctl = self.ns["ctl"]
        steps = [["ip", "netns", "add", ctl], ["ip", "-n", ctl, "link", "set", "lo", "up"],
                 ["ip", "-n", ctl, "link", "add", "br0", "type", "bridge"],
                 ["ip", "-n", ctl, "addr", "add", f"{self.net}.1/24", "dev", "br0"],
                 ["ip", "-n", ctl, "link", "set", "br0", "up"]]  # fmt: skip
        for i, n in enumerate(self.nodes, start=1):
            ns = self.ns[n]
            steps += [["ip", "netns", "add", ns], ["ip", "-n", ns, "link", "set", "lo", "up"],
                      ["ip", "-n", ctl, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0", "netns", ns],
                      ["ip", "-n", ctl, "link", "set", f"v{i}", "master", "br0", "up"],
                      ["ip", "-n", ns, "addr", "add", f"{self.address(n)}/24", "dev", "eth0"],
                      ["ip", "-n", ns, "link", "set", "eth0", "up"]]  # fmt: skip
        for step in steps:
            subprocess.run(step, check=True, capture_output=True)
        names = "".join(f"{self.address(n)} {n}\n" for n in self.nodes) + f"{self.net}.1 ctl {socket.gethostname()}\n"
        (self.dir / "hosts").write_text("127.0.0.1 localhost\n" + names)  # each namespace's /etc/hosts

    def _teardown(self) -> None:
        """Every process still in a node's namespaces (a ``slurmstepd`` outlives its ``slurmd``),
        stopped by pid; then the namespaces."""
        for ns in self.ns.values():
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
