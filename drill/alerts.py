"""Alerts on failure, error, SLO breach or abort: a webhook POST and/or a command.

The webhook payload is Slack-compatible (``text``) with structured fields beside it. Each
delivery is bounded: ``retries`` attempts, each within ``timeout`` seconds of wall clock in all
(not per socket read), redirects never followed; failures are recorded, never raised. A webhook URL usually *is* a secret (Slack's are): drill prints and stores only
its scheme and host.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from drill.catalogue import describe
from drill.findings import strict_json
from drill.policy.model import Alerts


@dataclass(slots=True)
class Delivery:
    channel: str
    target: str
    """Masked: never the full URL."""
    delivered: bool
    attempts: int
    error: str | None = None


def mask_url(url: str) -> str:
    """Scheme, host and port only: the path, query and credentials of a webhook are its secret."""
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # a port that is not a number: nothing of it is safe to show
        return "<webhook>"
    if not parts.scheme or not parts.hostname:
        return "<webhook>"
    return f"{parts.scheme}://{parts.hostname}{port}/…"


def resolve_webhook(value: str) -> str:
    """``env:NAME`` reads the URL from the environment, keeping the secret out of the file.
    A ``ValueError`` says what is wrong with it without ever quoting it."""
    url = value
    if value.startswith("env:"):
        url = os.environ.get(value[4:], "")
        if not url:
            raise ValueError(f"alerts.webhook names ${value[4:]}, which is not set")
    parts = urlsplit(url)
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or mask_url(url) == "<webhook>"
        or any(ord(c) < 0x21 for c in url)
    ):
        where = f"${value[4:]}" if value.startswith("env:") else "alerts.webhook"
        raise ValueError(f"{where} does not hold an http(s) URL with a host (its value is a secret and is not shown)")
    return url


PAYLOAD_VERSION = 1
"""The shape of an alert's body (its ``version`` field; schema: ``drill/schemas/alert-v1.schema.json``)."""

ALERT_ERRORS = 10
"""At most this many error findings in an alert (``errors_total`` counts them all): an alert
says why and what to do; ``drill show ID`` has the rest."""


def _errors(drill: dict[str, Any]) -> list[dict[str, Any]]:
    """The drill's error findings, each with what to do: its own hint, else the catalogue's."""
    out = []
    for check in drill.get("checks") or []:
        for f in check.get("findings") or []:
            if f.get("severity") != "error":
                continue
            known = describe(f.get("code", ""))
            hint = f.get("hint") or (known.hint if known else None)
            out.append(
                {
                    "check": check.get("name"),
                    "code": f.get("code"),
                    "subject": f.get("subject"),
                    "message": f.get("message"),
                    "hint": hint,
                }
            )
    return out


def payload(drill: dict[str, Any], policy: str | None) -> dict[str, Any]:
    """The alert for a drill's outcome document (:meth:`~drill.pipeline.outcome.DrillOutcome.to_document`)."""
    ck = drill.get("checkpoint") or {}
    subject = ck.get("uri") or drill.get("run_root")
    text = f"drill {drill['status'].upper()}: {policy or 'manual drill'} — {subject}"
    if drill.get("message"):
        text += f": {drill['message']}"
    timings = drill.get("timings") or {}
    errors = _errors(drill)
    return {
        "version": PAYLOAD_VERSION,
        "text": text,
        "drill_id": drill.get("id"),
        "policy": policy,
        "status": drill["status"],
        "exit_code": drill.get("exit_code"),
        "message": drill.get("message"),
        "checkpoint": ck or None,
        "run_root": drill.get("run_root"),
        "host": drill.get("host"),
        "restore_seconds": timings.get("restore"),
        "ttfs_seconds": timings.get("ttfs"),
        "slo_breaches": drill.get("slo_breaches"),
        "errors": errors[:ALERT_ERRORS],
        "errors_total": len(errors),
    }


def post_webhook(url: str, body: dict[str, Any], *, timeout: float, retries: int) -> Delivery:
    """POST ``body`` to ``url``: ``retries`` attempts, each bounded by ``timeout`` seconds of wall
    clock in all (connecting, sending, the status line, the headers and the body: a server that
    trickles its answer a byte at a time is cut off), never following a redirect."""
    data = strict_json(body).encode()
    error = None
    attempts = 0
    for attempt in range(max(1, retries)):
        attempts = attempt + 1
        request = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
        try:
            status = _post_within(request, timeout)
            if 200 <= status < 300:
                return Delivery("webhook", mask_url(url), True, attempts)
            error = f"HTTP {status}"
        except urllib.error.HTTPError as exc:
            error = f"HTTP {exc.code}" + (": redirects are not followed" if 300 <= exc.code < 400 else "")
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            error = (
                f"timed out (over {timeout:g} s)"
                if isinstance(reason, TimeoutError) or "timed out" in str(reason)
                else _without(str(reason), url)
            )
        except Exception as exc:  # noqa: BLE001 - an alert never fails the drill, and its message may quote the URL
            error = f"{type(exc).__name__}: the request could not be made"
        time.sleep(min(0.5 * 2**attempt, 5.0))
    return Delivery("webhook", mask_url(url), False, attempts, error)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A webhook that answers with a redirect is not delivered to: its 3xx is the answer (a
    redirect would carry the alert to wherever the server says, of any scheme)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _post_within(request: urllib.request.Request, timeout: float) -> int:
    """The response's status, the whole exchange within ``timeout`` seconds: past it, every
    socket the request opened is shut down, and the blocked read ends."""
    import http.client
    import socket
    import threading

    sockets: list[socket.socket] = []

    class Tracked(http.client.HTTPConnection):
        def connect(self) -> None:
            super().connect()
            sockets.append(self.sock)

    class TrackedTLS(http.client.HTTPSConnection):
        def connect(self) -> None:
            super().connect()
            sockets.append(self.sock)

    class HTTP(urllib.request.HTTPHandler):
        def http_open(self, req: Any) -> Any:
            return self.do_open(Tracked, req)

    class HTTPS(urllib.request.HTTPSHandler):
        def https_open(self, req: Any) -> Any:
            return self.do_open(TrackedTLS, req, context=self._context)  # type: ignore[attr-defined]

    expired = threading.Event()

    def cut() -> None:
        expired.set()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(timeout, cut)
    timer.daemon = True
    timer.start()
    try:
        with urllib.request.build_opener(HTTP, HTTPS, _NoRedirects).open(request, timeout=timeout) as response:
            response.read(1 << 16)
            if expired.is_set():
                raise TimeoutError("timed out")
            return int(response.status)
    except (OSError, http.client.HTTPException) as exc:
        if expired.is_set():
            raise TimeoutError("timed out") from None
        if isinstance(exc, http.client.HTTPException):
            raise OSError(f"{type(exc).__name__}: the answer was not HTTP") from None
        raise
    finally:
        timer.cancel()


def _without(text: str, url: str) -> str:
    """``text`` with the URL (a secret) and any piece of it longer than a host name removed."""
    for secret in {url, *(p for p in urlsplit(url)[2:] if len(p) > 3)}:
        text = text.replace(secret, "…")
    return text


def run_command(command: str, body: dict[str, Any], *, timeout: float) -> Delivery:
    env = {
        **os.environ,
        "DRILL_STATUS": str(body["status"]),
        "DRILL_ID": str(body.get("drill_id")),
        "DRILL_POLICY": str(body.get("policy")),
    }
    try:
        done = subprocess.run(
            command,
            shell=True,
            input=strict_json(body),
            text=True,
            timeout=timeout,
            env=env,
            capture_output=True,
        )
    except subprocess.TimeoutExpired:
        return Delivery("command", command.split()[0], False, 1, f"timed out after {timeout:g} s")
    ok = done.returncode == 0
    return Delivery("command", command.split()[0], ok, 1, None if ok else f"exit code {done.returncode}")


def send_alerts(alerts: Alerts, drill: dict[str, Any], policy: str | None) -> list[Delivery]:
    """Deliver the policy's alerts for ``drill`` if its status is one the policy alerts on."""
    if drill["status"] not in alerts.on:
        return []
    body = payload(drill, policy)
    out = []
    if alerts.webhook:
        try:
            url = resolve_webhook(alerts.webhook)
        except ValueError as exc:
            out.append(Delivery("webhook", alerts.webhook, False, 0, str(exc)))
        else:
            out.append(post_webhook(url, body, timeout=alerts.timeout, retries=alerts.retries))
    if alerts.command:
        out.append(run_command(alerts.command, body, timeout=alerts.timeout))
    return out
