"""A real S3-compatible server on 127.0.0.1 for the tests — moto's standalone server — and a
fault-injecting proxy in front of it (503 SlowDown, 403, connection resets, short bodies).

Both listen on loopback only and are stopped by process id / thread at the end.
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MotoServer:
        exe = Path(sys.executable).parent / "moto_server"
        self.proc = subprocess.Popen(
            [str(exe), "-H", "127.0.0.1", "-p", str(self.port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("moto_server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            self.proc.wait(10)


@dataclass
class Rule:
    """What the proxy does to requests whose path contains ``key`` (and whose method matches)."""

    key: str
    action: str
    """``slowdown`` (503), ``forbid`` (403), ``error`` (500), ``reset`` (close mid-body), ``short``
    (drop the tail), ``endless`` (a listing whose every page says more follow)."""
    times: int | None = None
    """How many matching requests it applies to (None: all)."""
    method: str | None = None
    hits: int = 0
    query: str | None = None
    """Only requests whose query string contains this (``list-type`` for ListObjectsV2)."""


@dataclass
class FaultProxy:
    upstream_port: int
    rules: list[Rule] = field(default_factory=list)
    requests: int = 0
    total_bps: float | None = None
    """Throttle: bytes per second of response bodies, all connections together (a storage's ceiling)."""
    request_bps: float | None = None
    """Throttle: bytes per second of each response body (one reader's link)."""

    def __post_init__(self) -> None:
        self._pace_lock = threading.Lock()
        self._next_free = 0.0

    def send_paced(self, wfile, data: bytes) -> None:
        """Write ``data`` no faster than the throttles allow (a virtual clock per response and one shared)."""
        if self.total_bps is None and self.request_bps is None:
            wfile.write(data)
            return
        mine = time.monotonic()
        for i in range(0, len(data), 64 << 10):
            piece = data[i : i + (64 << 10)]
            now = time.monotonic()
            with self._pace_lock:
                shared = max(now, self._next_free) + (len(piece) / self.total_bps if self.total_bps else 0.0)
                self._next_free = shared
            mine = max(now, mine) + (len(piece) / self.request_bps if self.request_bps else 0.0)
            wait = max(shared, mine) - time.monotonic()
            if wait > 0:
                time.sleep(wait)  # the throttle itself: pacing bytes, not waiting on an event
            wfile.write(piece)

    def start(self) -> FaultProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: object) -> None:
                pass

            def _any(self) -> None:
                proxy.requests += 1
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                rule = proxy.match(self.command, self.path)
                if rule is not None and rule.action in ("slowdown", "forbid", "error"):
                    status, code = {
                        "slowdown": (503, "SlowDown"),
                        "forbid": (403, "AccessDenied"),
                        "error": (500, "InternalError"),
                    }[rule.action]
                    payload = (
                        f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>injected</Message></Error>".encode()
                    )
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                headers["Host"] = self.headers.get("Host", "")
                path = self.path
                if rule is not None and rule.action == "endless":
                    # The next page of a listing that never ends is its first page again: the
                    # server never sees the proxy's own token (it may answer one with a 500).
                    path = re.sub(r"&?continuation-token=more-\d+", "", path).replace("?&", "?")
                conn.request(self.command, path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                if rule is not None and rule.action == "endless":
                    token = f"<NextContinuationToken>more-{proxy.requests}</NextContinuationToken>".encode()
                    data = data.replace(b"<IsTruncated>false</IsTruncated>", b"<IsTruncated>true</IsTruncated>" + token)
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if rule is not None and rule.action == "reset" and len(data) > 16:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                if rule is not None and rule.action == "short" and len(data) > 16:
                    self.wfile.write(data[: len(data) - 7])
                    self.close_connection = True
                    return
                proxy.send_paced(self.wfile, data)

            do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _any

            def do_HEAD(self) -> None:  # noqa: F811 - HEAD has no body to send
                rule = proxy.match(self.command, self.path)
                if rule is not None and rule.action in ("slowdown", "forbid"):
                    self.send_response(503 if rule.action == "slowdown" else 403)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=60)
                conn.request("HEAD", self.path, headers={k: v for k, v in self.headers.items()})
                resp = conn.getresponse()
                resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def match(self, method: str, path: str) -> Rule | None:
        for rule in self.rules:
            if rule.key not in path.split("?")[0] or (rule.method and rule.method != method):
                continue
            if rule.query is not None and rule.query not in (path.split("?", 1)[1] if "?" in path else ""):
                continue
            if rule.times is not None and rule.hits >= rule.times:
                continue
            rule.hits += 1
            return rule
        return None

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
