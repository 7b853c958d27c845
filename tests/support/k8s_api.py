"""A Kubernetes API server for the tests, on 127.0.0.1: the few endpoints ``drill submit``
uses (ConfigMaps, Services, Jobs, the pods of a Job), speaking the API's JSON to the official
client. No control plane can run here, so the test plays the controllers: it reads what was
applied and sets a Job's pods and status (:meth:`FakeCluster.run_pod`, :meth:`FakeCluster.end_job`).
Stopped by :meth:`close`; nothing else listens."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

ROUTE = re.compile(
    r"^/(?:api/v1|apis/batch/v1)/namespaces/(?P<ns>[^/]+)/(?P<kind>configmaps|services|jobs|pods)(?:/(?P<name>[^/]+))?$"
)


class FakeCluster:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.pods: dict[str, list[dict[str, Any]]] = {}
        self.job_created = threading.Event()
        self.job_deleted = threading.Event()
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": self.url}}],
            "users": [{"name": "test", "user": {"token": "not-a-secret"}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        }))  # fmt: skip
        return path

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- what the test does as the controllers ----------------------------------------------
    def job(self) -> dict[str, Any]:
        with self.lock:
            return next(v for (kind, _, _), v in self.objects.items() if kind == "jobs")

    def pending(self, reason: str, message: str) -> None:
        name = self.job()["metadata"]["name"]
        pod = _pod(name, "Pending")
        pod["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": reason, "message": message}
        ]
        with self.lock:
            self.pods[name] = [pod]

    def run_pod(self) -> None:
        job = self.job()
        with self.lock:
            self.pods[job["metadata"]["name"]] = [_pod(job["metadata"]["name"], "Running", node="node-7")]
            job["status"] = {"active": 1}

    def end_job(self, *, failed: bool, reason: str = "", message: str = "", exit_code: int = 0) -> None:
        job = self.job()
        name = job["metadata"]["name"]
        with self.lock:
            for pod in self.pods.get(name, []):
                pod["status"]["phase"] = "Failed" if failed else "Succeeded"
                pod["status"]["containerStatuses"] = [{"name": "drill", "image": "x", "imageID": "", "ready": False, "restartCount": 0,
                                                       "state": {"terminated": {"exitCode": exit_code, "reason": "Error" if failed else "Completed"}}}]  # fmt: skip
            condition = {
                "type": "Failed" if failed else "Complete",
                "status": "True",
                "reason": reason or None,
                "message": message or None,
            }
            job["status"] = {"failed": 1} if failed else {"succeeded": 1}
            job["status"]["conditions"] = [condition]

    # -- the API ------------------------------------------------------------------------------
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        cluster = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self) -> tuple[str, str, str | None, dict[str, list[str]]]:
                url = urlparse(self.path)
                m = ROUTE.match(url.path)
                if m is None:
                    return "", "", None, {}
                return m["kind"], m["ns"], m["name"], parse_qs(url.query)

            def _body(self) -> dict[str, Any]:
                return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")

            def do_POST(self) -> None:
                kind, ns, _, _ = self._route()
                doc = self._body()
                key = (kind, ns, doc["metadata"]["name"])
                with cluster.lock:
                    if key in cluster.objects:
                        return self._send(409, _status(409, "AlreadyExists", f"{kind} {key[2]} already exists"))
                    doc.setdefault("status", {})
                    cluster.objects[key] = doc
                if kind == "jobs":
                    cluster.job_created.set()
                self._send(201, doc)

            def do_PUT(self) -> None:
                kind, ns, name, _ = self._route()
                doc = self._body()
                with cluster.lock:
                    cluster.objects[(kind, ns, name or "")] = doc
                self._send(200, doc)

            def do_GET(self) -> None:
                kind, ns, name, query = self._route()
                if kind == "pods":
                    selector = query.get("labelSelector", [""])[0].removeprefix("job-name=")
                    with cluster.lock:
                        items = list(cluster.pods.get(selector, []))
                    return self._send(200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})
                with cluster.lock:
                    doc = cluster.objects.get((kind, ns, name or ""))
                if doc is None:
                    return self._send(404, _status(404, "NotFound", f"{kind} {name} not found"))
                self._send(200, doc)

            def do_DELETE(self) -> None:
                kind, ns, name, _ = self._route()
                with cluster.lock:
                    doc = cluster.objects.pop((kind, ns, name or ""), None)
                    cluster.pods.pop(name or "", None)
                if doc is None:
                    return self._send(404, _status(404, "NotFound", f"{kind} {name} not found"))
                if kind == "jobs":
                    cluster.job_deleted.set()
                self._send(200, _status(200, "Success", "deleted"))

        return Handler


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Success" if code < 300 else "Failure",
        "code": code,
        "reason": reason,
        "message": message,
        "metadata": {},
    }


def _pod(job: str, phase: str, node: str | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{job}-0-abcde", "labels": {"job-name": job}},
        "spec": {"containers": [{"name": "drill", "image": "x"}], **({"nodeName": node} if node else {})}, "status": {"phase": phase},
    }  # fmt: skip


__all__ = ["FakeCluster"]
