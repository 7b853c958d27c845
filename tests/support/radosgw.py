"""Ceph's radosgw on 127.0.0.1: a full S3 implementation, for the benchmark and the tests that
want a second, real server beside moto.

One monitor, one OSD on ``memstore`` (no disk to prepare) and one gateway, every path under one
temporary directory and every daemon in the foreground as a child of this process, stopped by
pid. Needs Debian's ``ceph-mon ceph-osd radosgw ceph-common``; :func:`available` says whether
they are installed. Cold start takes about 15 s on two cores.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from tests.support.s3server import free_port

BINARIES = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "ceph", "ceph-authtool", "monmaptool")

CONF = """\
[global]
fsid = {fsid}
mon host = [v2:127.0.0.1:{mon_v2},v1:127.0.0.1:{mon_v1}]
mon initial members = a
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind ipv6 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = {d}/admin.keyring
run dir = {d}/run
admin socket = {d}/run/$name.asok
pid file = {d}/run/$name.pid
log file = {d}/log/$name.log
osd objectstore = memstore
memstore device bytes = {memstore_bytes}
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon max pg per osd = 1000
osd crush chooseleaf type = 0
mon data = {d}/mon/$cluster-$id
osd data = {d}/osd/$cluster-$id

[mon]
keyring = {d}/mon.keyring

[osd]
keyring = {d}/osd/$cluster-$id/keyring

[client.rgw.a]
keyring = {d}/rgw.keyring
rgw frontends = beast endpoint=127.0.0.1:{rgw_port} tcp_nodelay=1
rgw data = {d}/rgw
"""


def available() -> bool:
    return all(shutil.which(b) for b in BINARIES)


class RadosGateway:
    """``with RadosGateway() as rgw:`` → ``rgw.url``, ``rgw.access_key``, ``rgw.secret_key``."""

    def __init__(self, memstore_bytes: int = 4 << 30) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="drill-rgw-"))
        self.port = free_port()
        self.access_key = "drillbench"
        self.secret_key = uuid.uuid4().hex
        self.memstore_bytes = memstore_bytes
        self.conf = self.dir / "ceph.conf"
        self.procs: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> RadosGateway:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _ceph(self, *args: str) -> str:
        return subprocess.run(
            ["ceph", "-c", str(self.conf), *args], check=True, capture_output=True, text=True, timeout=60
        ).stdout

    def _daemon(self, *cmd: str) -> None:
        log = open(self.dir / "log" / f"{Path(cmd[0]).name}-{len(self.procs)}.out", "wb")
        self.procs.append(subprocess.Popen([*cmd, "-c", str(self.conf), "-f"], stdout=log, stderr=subprocess.STDOUT))

    def start(self) -> None:
        d = self.dir
        for sub in ("run", "log", "mon", "osd/ceph-0", "rgw"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        fsid = str(uuid.uuid4())
        mon_v2, mon_v1 = free_port(), free_port()
        self.conf.write_text(
            CONF.format(
                fsid=fsid, mon_v2=mon_v2, mon_v1=mon_v1, d=d, rgw_port=self.port, memstore_bytes=self.memstore_bytes
            )
        )
        run = lambda *a: subprocess.run(a, check=True, capture_output=True, timeout=60)  # noqa: E731
        run(
            "ceph-authtool",
            "--create-keyring",
            f"{d}/mon.keyring",
            "--gen-key",
            "-n",
            "mon.",
            "--cap",
            "mon",
            "allow *",
        )
        run(
            "ceph-authtool",
            "--create-keyring",
            f"{d}/admin.keyring",
            "--gen-key",
            "-n",
            "client.admin",
            "--cap",
            "mon",
            "allow *",
            "--cap",
            "osd",
            "allow *",
            "--cap",
            "mgr",
            "allow *",
        )
        run("ceph-authtool", f"{d}/mon.keyring", "--import-keyring", f"{d}/admin.keyring")
        run(
            "monmaptool",
            "--create",
            "--addv",
            "a",
            f"[v2:127.0.0.1:{mon_v2},v1:127.0.0.1:{mon_v1}]",
            "--fsid",
            fsid,
            f"{d}/monmap",
        )
        run(
            "ceph-mon",
            "-c",
            str(self.conf),
            "--mkfs",
            "-i",
            "a",
            "--monmap",
            f"{d}/monmap",
            "--keyring",
            f"{d}/mon.keyring",
        )
        self._daemon("ceph-mon", "-i", "a")
        osd_uuid = str(uuid.uuid4())
        osd_id = self._ceph("osd", "new", osd_uuid).strip()
        self._ceph(
            "auth",
            "get-or-create",
            f"osd.{osd_id}",
            "mon",
            "allow profile osd",
            "osd",
            "allow *",
            "mgr",
            "allow profile osd",
            "-o",
            f"{d}/osd/ceph-{osd_id}/keyring",
        )
        run("ceph-osd", "-c", str(self.conf), "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid)
        self._daemon("ceph-osd", "-i", osd_id)
        self._ceph(
            "auth", "get-or-create", "client.rgw.a", "mon", "allow rw", "osd", "allow rwx", "-o", f"{d}/rgw.keyring"
        )
        self._daemon("radosgw", "-n", "client.rgw.a")
        self._wait_for_gateway()
        subprocess.run(
            [
                "radosgw-admin",
                "-c",
                str(self.conf),
                "user",
                "create",
                "--uid=drill",
                "--display-name=drill",
                f"--access-key={self.access_key}",
                f"--secret-key={self.secret_key}",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self._wait_for_user()

    def _wait_for_gateway(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a Ceph daemon exited during start-up; logs in {self.dir / 'log'}")
            try:
                urllib.request.urlopen(self.url, timeout=1).close()
                return
            except urllib.error.HTTPError:
                return  # the gateway answers (403 to an anonymous request)
            except OSError:
                time.sleep(0.25)
        raise RuntimeError(f"radosgw did not answer on {self.url} within {timeout:.0f} s; logs in {self.dir / 'log'}")

    def _wait_for_user(self, timeout: float = 60) -> None:
        """The gateway may answer before it sees the new user: wait for a signed request to pass."""
        import boto3
        from botocore.exceptions import ClientError

        client = boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.list_buckets()
                return
            except ClientError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                os.kill(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(5)
        self.procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)
