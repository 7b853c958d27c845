"""Alerts against a real HTTP server on 127.0.0.1: delivered, bounded, and secret-free."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from drill.alerts import ALERT_ERRORS, mask_url, payload, send_alerts
from drill.catalogue import describe
from drill.policy.model import Alerts

DRILL = {
    "id": 7,
    "status": "failed",
    "message": "__0_0.distcp is missing",
    "run_root": "/r",
    "checkpoint": {"uri": "/r/step-30"},
    "checks": [
        {
            "name": "integrity",
            "findings": [
                {"severity": "error", "code": "file-missing", "subject": "__0_0.distcp", "message": "missing"}
            ],
        },
        {
            "name": "contract",
            "findings": [{"severity": "warning", "code": "still-zero", "message": "a moment is zero"}],
        },
    ],
}


class _Hook(BaseHTTPRequestHandler):
    received: list[dict] = []
    delay = 0.0

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.delay:
            time.sleep(self.delay)
        type(self).received.append({"path": self.path, "body": body})
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hook() -> Iterator[tuple[str, type[_Hook]]]:
    handler = type("Hook", (_Hook,), {"received": [], "delay": 0.0})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/services/T000/B000/s3cr3tT0ken", handler
    finally:
        server.shutdown()
        server.server_close()


def test_webhook_receives_a_slack_compatible_payload(hook) -> None:
    url, handler = hook
    (delivery,) = send_alerts(Alerts(webhook=url), DRILL, "demo-nightly")
    assert delivery.delivered and delivery.attempts == 1
    (got,) = handler.received
    assert got["path"] == "/services/T000/B000/s3cr3tT0ken"
    assert got["body"]["text"] == "drill FAILED: demo-nightly — /r/step-30: __0_0.distcp is missing"
    assert got["body"]["status"] == "failed" and got["body"]["drill_id"] == 7
    assert "s3cr3t" not in delivery.target and delivery.target.startswith("http://127.0.0.1:")
    (error,) = got["body"]["errors"]  # the errors only, each with what to do (the catalogue's hint)
    assert error["code"] == "file-missing" and error["subject"] == "__0_0.distcp" and got["body"]["errors_total"] == 1
    assert error["hint"] == describe("file-missing").hint


def test_an_alert_carries_at_most_ten_errors_and_counts_them_all() -> None:
    many = [{"severity": "error", "code": "digest-mismatch", "subject": f"f{i}", "hint": "re-save"} for i in range(25)]
    body = payload({**DRILL, "checks": [{"name": "integrity", "findings": many}]}, "p")
    assert len(body["errors"]) == ALERT_ERRORS == 10 and body["errors_total"] == 25
    assert (
        body["errors"][0]["hint"] == "re-save" and body["errors"][9]["subject"] == "f9"
    )  # its own hint first, in order


@pytest.mark.slow
def test_webhook_that_times_out_is_retried_a_bounded_number_of_times(hook) -> None:
    url, handler = hook
    handler.delay = 2.0
    started = time.monotonic()
    (delivery,) = send_alerts(Alerts(webhook=url, timeout=0.5, retries=2), DRILL, "p")
    assert not delivery.delivered and delivery.attempts == 2 and delivery.error == "timed out (over 0.5 s)"
    assert time.monotonic() - started < 6


def test_unreachable_webhook_and_env_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRILL_TEST_HOOK", "http://127.0.0.1:9/hook/s3cr3t")
    (delivery,) = send_alerts(Alerts(webhook="env:DRILL_TEST_HOOK", timeout=1, retries=1), DRILL, "p")
    assert not delivery.delivered and "s3cr3t" not in delivery.target
    (missing,) = send_alerts(Alerts(webhook="env:DRILL_NOT_SET", retries=1), DRILL, "p")
    assert not missing.delivered and "not set" in (missing.error or "")


def test_passed_drills_do_not_alert(hook) -> None:
    url, handler = hook
    assert send_alerts(Alerts(webhook=url), {**DRILL, "status": "passed"}, "p") == []
    assert handler.received == []


def test_command_alert_gets_the_payload_on_stdin(tmp_path: Path) -> None:
    out = tmp_path / "alert.json"
    (delivery,) = send_alerts(Alerts(command=f"cat > {out}"), DRILL, "p")
    assert delivery.delivered and json.loads(out.read_text())["status"] == "failed"


def test_mask_url() -> None:
    assert mask_url("https://hooks.slack.com/services/T/B/XYZ") == "https://hooks.slack.com/…"
    assert mask_url("https://user:pw@example.com:8443/x?token=1") == "https://example.com:8443/…"


@pytest.mark.parametrize(
    "value",
    [
        "s3cr3tT0ken-not-a-url",  # a token alone, where the URL should be
        "http://hooks.example:s3cr3tT0ken/x",  # a port that is not a number
        "http://127.0.0.1:9/x\ns3cr3tT0ken",  # a control character: http.client quotes the URL
        "ftp://127.0.0.1/s3cr3tT0ken",
        "https:///s3cr3tT0ken",  # no host
    ],
)
def test_a_webhook_secret_from_the_environment_is_never_shown_whatever_it_holds(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """Whatever $NAME holds, the delivery fails (or is made) without quoting it and without raising."""
    monkeypatch.setenv("DRILL_TEST_HOOK", value)
    (delivery,) = send_alerts(Alerts(webhook="env:DRILL_TEST_HOOK", timeout=1, retries=1), DRILL, "p")
    assert not delivery.delivered
    assert "s3cr3tT0ken" not in f"{delivery.target} {delivery.error}", delivery


@pytest.mark.slow
def test_a_policy_drill_with_a_bad_webhook_secret_is_recorded_and_the_next_one_runs(
    demo_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess
    import sys

    db = f"sqlite:///{tmp_path / 'd.db'}"
    (sorted(demo_run.glob("step-*"))[-1] / "__0_0.distcp").unlink()  # a failing drill alerts
    policy = tmp_path / "p.yaml"
    policy.write_text(
        f"name: hooked\ncheckpoints: {{root: {demo_run}}}\nschedule: {{cron: '0 3 * * *'}}\nreplay: {{enabled: false}}\nalerts: {{webhook: env:DRILL_TEST_HOOK, timeout: 1s, retries: 1}}\n"
    )
    env = {**__import__("os").environ, "DRILL_TEST_HOOK": "http://hooks.example:s3cr3tT0ken/x"}
    drill = str(Path(sys.executable).parent / "drill")
    runs = [
        subprocess.run(
            [drill, "run", "--policy", str(policy), "--db", db, "--json"], env=env, capture_output=True, text=True
        )
        for _ in range(2)
    ]
    for done in runs:
        assert done.returncode == 1, done.stderr[-1500:]
        assert "s3cr3tT0ken" not in done.stdout + done.stderr
        assert json.loads(done.stdout)["alerts"][0]["delivered"] is False
