"""`drill submit` on a Kubernetes cluster: the Job applied through the API with the official
client and followed to its end, the drill recorded once whatever happens to the Job. The API
server is tests/support/k8s_api.py on 127.0.0.1 (no control plane can run here); the test plays the
controllers and the pod — whose drill is a real `drill run`, as the pod would run it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from drill import history
from tests.conftest import invoke
from tests.support.k8s_api import FakeCluster

pytest.importorskip("kubernetes", reason="the kubernetes client is not installed (pip install '.[dev]')")


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCluster]:
    c = FakeCluster()
    monkeypatch.setenv("KUBECONFIG", str(c.kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    try:
        yield c
    finally:
        c.close()


def _policy(tmp_path: Path, root: Path, extra: str = "") -> Path:
    path = tmp_path / "k8s.yaml"
    path.write_text(
        f"name: nightly\ncheckpoints: {{root: {root}}}\nreplay: {{enabled: false}}\nlimits: {{timeout: 5m}}\n"
        f"allocation:\n  launcher: k8s\n  image: registry.internal/drill:0.3\n  namespace: training\n  volume_claim: checkpoints\n{extra}"
    )
    return path


def _as_controllers(cluster: FakeCluster, act) -> threading.Thread:
    def run() -> None:
        assert cluster.job_created.wait(60)
        act(cluster.job())

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.slow
def test_a_job_whose_pod_runs_the_drill_ends_with_its_record(
    cluster: FakeCluster, demo_run: Path, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'drill.db'}"

    def pod(job: dict) -> None:
        cluster.run_pod()
        container = job["spec"]["template"]["spec"]["containers"][0]
        assert {"name": "DRILL_JOB_ID", "value": "k8s:$(JOB_NAME)"} in container["env"]
        env = {**os.environ, "DRILL_JOB_ID": f"k8s:{job['metadata']['name']}"}  # what the pod's $(JOB_NAME) expands to
        res = subprocess.run(
            [sys.executable, "-m", "drill", "run", "--root", str(demo_run), "--db", db, "-q", "--no-replay"],
            env=env,
            capture_output=True,
            text=True,
        )
        cluster.end_job(failed=res.returncode != 0, exit_code=res.returncode)

    controllers = _as_controllers(cluster, pod)
    res = invoke(CliRunner(), "submit", "--policy", str(_policy(tmp_path, demo_run)), "--db", db)
    controllers.join()
    assert res.exit_code == 0, res.stderr
    assert re.search(
        r"drill: submitted kubernetes Job drill-nightly-[0-9a-f]{6} \(logs: kubectl logs -n training job/drill-nightly-[0-9a-f]{6}\)",
        res.stderr,
    )
    assert "ended COMPLETE" in res.stderr
    (recorded,) = history(db=db)
    assert recorded.status == "passed" and recorded.job_id == f"k8s:{cluster.job()['metadata']['name']}"


@pytest.mark.slow
def test_a_job_that_fails_under_its_drill_closes_the_record(
    cluster: FakeCluster, demo_run: Path, tmp_path: Path
) -> None:
    """The pod is killed (OOM, its node lost) with the drill's record open: drill submit closes
    it as an error naming the Job and why it failed."""
    from datetime import datetime, timezone

    from drill.pipeline.recorder import DrillStart
    from drill.records.db import open_database
    from drill.records.store import Records

    db = f"sqlite:///{tmp_path / 'drill.db'}"

    def pod(job: dict) -> None:
        cluster.run_pod()
        database = open_database(db)  # what the pod's drill had written when it was killed
        Records(database).begin_drill(DrillStart(run_root=str(demo_run), selector="latest", trigger="policy", device="cpu", policy="nightly",
                                                 started_at=datetime.now(timezone.utc), versions={"drill": "0"}, job_id=f"k8s:{job['metadata']['name']}"), pid=1)  # fmt: skip
        database.close()
        cluster.end_job(
            failed=True,
            reason="BackoffLimitExceeded",
            message="Job has reached the specified backoff limit",
            exit_code=137,
        )

    controllers = _as_controllers(cluster, pod)
    res = invoke(CliRunner(), "submit", "--policy", str(_policy(tmp_path, demo_run)), "--db", db)
    controllers.join()
    assert res.exit_code == 5, res.stderr
    (recorded,) = history(db=db)
    assert recorded.status == "error" and re.search(
        r"kubernetes Job drill-nightly-\w+ ended FAILED \(BackoffLimitExceeded Job has reached", recorded.message or ""
    ), recorded.message


@pytest.mark.slow
def test_a_job_pending_past_the_queue_timeout_is_deleted_and_recorded(
    cluster: FakeCluster, demo_run: Path, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    controllers = _as_controllers(
        cluster, lambda job: cluster.pending("Unschedulable", "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")
    )
    res = invoke(
        CliRunner(), "submit", "--policy", str(_policy(tmp_path, demo_run, "  queue_timeout: 3s\n")), "--db", db
    )
    controllers.join()
    assert res.exit_code == 5 and cluster.job_deleted.is_set()
    (recorded,) = history(db=db)
    assert (
        recorded.status == "error"
        and "still pending after 3 s (Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.)"
        in (recorded.message or "")
    )
    assert "job output" not in (recorded.message or "")  # a Job that never ran has no logs to point at


@pytest.mark.slow
def test_ctrl_c_deletes_the_job_and_records_the_drill_aborted(
    cluster: FakeCluster, demo_run: Path, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'drill.db'}"
    proc = subprocess.Popen([sys.executable, "-m", "drill", "submit", "--policy", str(_policy(tmp_path, demo_run)), "--db", db],
                            env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert cluster.job_created.wait(120)
    cluster.pending("Unschedulable", "0/3 nodes are available")
    assert proc.stderr is not None
    for line in proc.stderr:  # the event: drill submit has seen the pod pending
        if ": pending" in line:
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert cluster.job_deleted.is_set()
    (recorded,) = history(db=db)
    assert recorded.status == "aborted" and "drill submit was interrupted (SIGINT): kubernetes Job drill-nightly-" in (
        recorded.message or ""
    )


def test_without_a_cluster_the_manifests_are_printed(
    demo_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    res = invoke(CliRunner(), "submit", "--policy", str(_policy(tmp_path, demo_run)))
    assert res.exit_code == 0 and "kind: Job" in res.stdout and "no Kubernetes cluster is configured" in res.stderr
