"""A policy's Kubernetes Job applied and followed through the API, with the official client.

When a cluster is configured — in a pod, its service account; elsewhere ``$KUBECONFIG`` or
``~/.kube/config`` — ``drill submit`` (and the scheduler) apply the manifests of
:mod:`~drill.launch.k8s` and follow the Job to its end as they follow a Slurm job
(:func:`~drill.launch.jobs.follow`): pods pending past the queue timeout, or unschedulable for
good, get the Job deleted; a Job that fails (a pod killed, its deadline passed) closes the
drill's record as an ``error``; Ctrl-C deletes the Job and records the drill ``aborted``.
Needs the ``kubernetes`` package (``pip install 'drill[k8s]'``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

NEVER_SCHEDULES = ("didn't match Pod's node affinity/selector", "persistentvolumeclaim", "not found")
"""Words of a pod's Unschedulable message that no waiting fixes (a selector nothing matches,
a claim that does not exist)."""


def configured_api() -> Any | None:
    """An API client for the configured cluster; None when there is none (or no client)."""
    try:
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException
    except ImportError:
        return None
    try:
        config.load_incluster_config()
    except ConfigException:
        try:
            config.load_kube_config(
                config_file=os.environ.get("KUBECONFIG") or None
            )  # read now: the client reads it once, at import
        except (ConfigException, OSError, TypeError, ValueError):
            return None
    return client.ApiClient()


def apply(api: Any, docs: list[dict[str, Any]], namespace: str) -> None:
    """Create the ConfigMap (replacing an older one of the policy), the Service (kept when it
    exists) and the Job (new: its name is this run's)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    for doc in docs:
        body: Any = doc  # the client takes a plain manifest as its model classes' body
        name, kind = doc["metadata"]["name"], doc["kind"]
        try:
            if kind == "ConfigMap":
                core.create_namespaced_config_map(namespace, body)
            elif kind == "Service":
                core.create_namespaced_service(namespace, body)
            else:
                batch.create_namespaced_job(namespace, body)
        except ApiException as exc:
            if exc.status != 409 or kind == "Job":
                raise
            if kind == "ConfigMap":
                core.replace_namespaced_config_map(name, namespace, body)


def refusal(exc: Exception) -> str:
    """The API server's own message for a refused request (its ``Status`` body), in one line."""
    body = getattr(exc, "body", None)
    if body:
        import json

        try:
            return str(json.loads(body).get("message", body))[:300]
        except (ValueError, AttributeError):
            return str(body)[:300]
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"


@dataclass(slots=True)
class KubeJob:
    """A Job in the cluster, for :func:`~drill.launch.jobs.follow`."""

    api: Any
    job_id: str
    namespace: str
    kind: str = "kubernetes Job"

    def _job(self) -> Any | None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        try:
            return client.BatchV1Api(self.api).read_namespaced_job(self.job_id, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def state(self) -> tuple[str, str] | None:
        job = self._job()
        if job is None or _ended(job) is not None:
            return None
        pending = [p for p in self._pods() if p.status.phase == "Pending"]
        if pending or not (job.status.active or 0):
            return "PENDING", _why_pending(pending)
        return "RUNNING", ""

    def _pods(self) -> list[Any]:
        from kubernetes import client

        return list(
            client.CoreV1Api(self.api)
            .list_namespaced_pod(self.namespace, label_selector=f"job-name={self.job_id}")
            .items
        )

    def never_runs(self, reason: str) -> bool:
        return reason.startswith("Unschedulable") and any(w in reason for w in NEVER_SCHEDULES)

    def cancel(self) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        try:
            client.BatchV1Api(self.api).delete_namespaced_job(
                self.job_id, self.namespace, propagation_policy="Background"
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def final(self) -> tuple[str, int | None, str, str | None]:
        job = self._job()
        if job is None:
            return "DELETED", None, "the Job is gone (deleted)", None
        ended = _ended(job) or ("UNKNOWN", "the Job has not ended")
        pods = self._pods()
        host = next((p.spec.node_name for p in pods if p.spec and p.spec.node_name), None)
        return ended[0], _exit_code(pods), ended[1], host


def _ended(job: Any) -> tuple[str, str] | None:
    for cond in job.status.conditions or []:
        if cond.status == "True" and cond.type in ("Complete", "Failed"):
            return ("COMPLETE" if cond.type == "Complete" else "FAILED"), " ".join(
                x for x in (cond.reason, cond.message) if x
            )
    return None


def _why_pending(pods: list[Any]) -> str:
    for pod in pods:
        for cond in pod.status.conditions or []:
            if cond.type == "PodScheduled" and cond.status == "False":
                return f"{cond.reason}: {cond.message}" if cond.message else str(cond.reason)
        for status in pod.status.container_statuses or []:
            waiting = status.state.waiting if status.state else None
            if waiting is not None and waiting.reason:
                return f"{waiting.reason}: {waiting.message}" if waiting.message else waiting.reason
    return "no pod running yet"


def _exit_code(pods: list[Any]) -> int | None:
    """Pod 0's container exit code (the rank that records), when it terminated."""
    for pod in sorted(pods, key=lambda p: p.metadata.name):
        for status in pod.status.container_statuses or []:
            done = status.state.terminated if status.state else None
            if done is not None:
                return int(done.exit_code)
    return None


__all__ = ["KubeJob", "apply", "configured_api", "refusal"]
