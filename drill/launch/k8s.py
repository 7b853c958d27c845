"""A policy's drill as Kubernetes manifests: a Job for tonight, or a CronJob for every night.

An **Indexed Job** (``batch/v1``, ``completionMode: Indexed``) with one pod per node and a
headless Service: built into Kubernetes since 1.24, nothing to install. (A JobSet or a
Kubeflow PyTorchJob would add gang scheduling and restart policies, but each needs its
controller running in the cluster; an Indexed Job runs anywhere.) Each pod runs ``torchrun``
with ``--node-rank`` = its completion index and pod 0 — stable DNS name
``<job>-0.<service>`` — as the rendezvous host; torchrun starts ``ranks_per_node`` ranks of
``drill run --policy`` (mounted from a ConfigMap).

What a real cluster asks of the pods, they have: the ``restricted`` Pod Security level (non-root
user, no privilege escalation, every capability dropped, the runtime's seccomp profile) —
checked on every rendered pod (:func:`drill.launch.pss.restricted_violations`), and said when it falls short (a
``hostPath`` volume needs the ``privileged`` level: :func:`warnings_for`); CPU
and memory requests (and a memory limit); the checkpoint root mounted read-only from the
policy's PersistentVolumeClaim (or hostPath); S3 credentials and the database URL from named
Secrets, never from the manifest. Every Job has a name of its own (a CronJob's are the
controller's), so tonight's Job never blocks tomorrow's; the time limit counts from the pod's
start (``activeDeadlineSeconds`` on the pod), not from the time it spent pending.
"""

from __future__ import annotations

import secrets
from typing import Any

import yaml

from drill.launch.pss import restricted_violations
from drill.launch.slurm import time_limit_minutes
from drill.policy.model import Policy

PORT = 29500
MIN_VERSION = "1.27"
"""The oldest Kubernetes the manifests are for: Indexed Jobs are GA from 1.24, a CronJob's
``timeZone`` from 1.27 (the tests validate against every schema from here on)."""
POLICY_DIR = "/etc/drill"


NAME_LIMIT = 40
"""A base name's length at most: a CronJob's name (52) less room for its Jobs' suffix, and the
``-policy`` of the ConfigMap's."""


def base_name(policy: Policy) -> str:
    """``drill-<policy>`` as a DNS label (lower case, ``-``), short enough for a CronJob's name.
    A policy name that does not map onto one as it is (too long, or holding ``_``, ``.`` or
    capitals) gets a hash of the whole name: two policies never render the same objects, where
    the second would silently replace the first's."""
    import hashlib

    cleaned = "".join(c if c.isascii() and c.isalnum() else "-" for c in policy.name.lower()).strip("-")
    name = f"drill-{cleaned}"
    if cleaned == policy.name and len(name) <= NAME_LIMIT:
        return name
    digest = hashlib.sha256(policy.name.encode()).hexdigest()[:8]
    return f"{name[: NAME_LIMIT - 9].rstrip('-')}-{digest}"


def manifests(policy: Policy, *, cron: bool = False, suffix: str | None = None) -> list[dict[str, Any]]:
    """The ConfigMap with the policy, the headless Service the ranks meet through, and the Job
    (named ``drill-<policy>-<suffix>``, a random suffix by default) or, with ``cron``, a CronJob
    on the policy's schedule."""
    a = policy.allocation
    name = base_name(policy)
    labels = {"app.kubernetes.io/name": "drill", "drill/policy": name}
    config = {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-policy", "labels": labels},
        "data": {"policy.yaml": policy.source},
    }  # fmt: skip
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels},
        "spec": {"clusterIP": "None", "selector": {"drill/policy": name}, "ports": [{"name": "rendezvous", "port": PORT}]},
    }  # fmt: skip
    job_spec = {
        "completionMode": "Indexed",
        "completions": a.nodes,
        "parallelism": a.nodes,
        "backoffLimit": 0,
        "template": {"metadata": {"labels": labels}, "spec": _pod(policy, name)},
    }
    if cron:
        workload = _cronjob(policy, name, labels, job_spec)
    else:
        workload = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": f"{name}-{suffix or secrets.token_hex(3)}", "labels": labels},
            "spec": job_spec,
        }
    docs = [config, service, workload]
    for doc in docs:
        if a.namespace:
            doc["metadata"]["namespace"] = a.namespace
    return docs


def _cronjob(policy: Policy, name: str, labels: dict[str, str], job_spec: dict[str, Any]) -> dict[str, Any]:
    if policy.schedule is None:
        from drill.errors import UsageError

        raise UsageError(f"policy {policy.name} has no schedule: a CronJob needs schedule.cron")
    spec: dict[str, Any] = {
        "schedule": policy.schedule.cron,
        "timeZone": policy.schedule.timezone,
        "concurrencyPolicy": "Forbid",  # a drill still running is not doubled
        "startingDeadlineSeconds": int(policy.schedule.start_window),
        "successfulJobsHistoryLimit": 3,
        "failedJobsHistoryLimit": 7,
        "jobTemplate": {"metadata": {"labels": labels}, "spec": job_spec},
    }
    return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name, "labels": labels}, "spec": spec}


def _pod(policy: Policy, name: str) -> dict[str, Any]:
    a = policy.allocation
    command = [
        "torchrun", f"--nnodes={a.nodes}", f"--nproc-per-node={a.ranks_per_node}", "--node-rank=$(JOB_COMPLETION_INDEX)",
        f"--master-addr=$(JOB_NAME)-0.{name}", f"--master-port={PORT}", "-m", "drill", "run", "--policy", f"{POLICY_DIR}/policy.yaml", "--quiet",
    ]  # fmt: skip
    container: dict[str, Any] = {
        "name": "drill",
        "image": a.image,
        "command": command,
        "env": _env(a),
        "ports": [{"containerPort": PORT, "name": "rendezvous"}],
        "resources": _resources(policy),
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True},
        "volumeMounts": [{"name": "policy", "mountPath": POLICY_DIR, "readOnly": True}],
    }
    if a.s3_secret:
        container["envFrom"] = [{"secretRef": {"name": a.s3_secret}}]
    volumes: list[dict[str, Any]] = [{"name": "policy", "configMap": {"name": f"{name}-policy"}}]
    if a.volume_claim or a.host_path:
        source = (
            {"persistentVolumeClaim": {"claimName": a.volume_claim, "readOnly": True}}
            if a.volume_claim
            else {"hostPath": {"path": a.host_path, "type": "Directory"}}
        )
        volumes.append({"name": "checkpoints", **source})
        container["volumeMounts"].append(
            {"name": "checkpoints", "mountPath": policy.checkpoints.root, "readOnly": True}
        )
    pod: dict[str, Any] = {
        "subdomain": name,
        "restartPolicy": "Never",
        "activeDeadlineSeconds": time_limit_minutes(policy) * 60,  # from the pod's start: time pending does not count
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": a.run_as_user,
            "runAsGroup": a.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    if a.node_selector:
        pod["nodeSelector"] = dict(a.node_selector)
    tolerations = _tolerations(a)
    if tolerations:
        pod["tolerations"] = tolerations
    return pod


def _tolerations(a: Any) -> list[dict[str, Any]]:
    """The policy's tolerations, and — for pods asking for GPUs — the ``<gpu_resource>:NoSchedule``
    taint GPU pools carry, unless the policy already says how to tolerate it."""
    out = [dict(t) for t in a.tolerations]
    covered = any(t.get("key") == a.gpu_resource or (not t.get("key") and t.get("operator") == "Exists") for t in out)
    if a.gpus_per_node and not covered:
        out.append({"key": a.gpu_resource, "operator": "Exists", "effect": "NoSchedule"})
    return out


def _env(a: Any) -> list[dict[str, Any]]:
    return [
        {"name": "JOB_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['job-name']"}}},
        {"name": "DRILL_DATABASE_URL", "valueFrom": {"secretKeyRef": {"name": a.database_secret, "key": "url"}}},
        {"name": "DRILL_JOB_ID", "value": "k8s:$(JOB_NAME)"},
    ]


def _resources(policy: Policy) -> dict[str, Any]:
    a = policy.allocation
    memory = f"{(a.memory or policy.limits.memory or 4 << 30) >> 20}Mi"
    cpu = f"{a.cpu if a.cpu is not None else a.ranks_per_node:g}"
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}}
    if a.gpus_per_node:
        resources["limits"][a.gpu_resource] = str(a.gpus_per_node)  # a quantity: a string
    return resources


def pod_of(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The pod spec of a Job or CronJob manifest."""
    spec = doc.get("spec", {})
    if doc.get("kind") == "CronJob":
        spec = spec.get("jobTemplate", {}).get("spec", {})
    return spec.get("template", {}).get("spec") if doc.get("kind") in ("Job", "CronJob") else None


def warnings_for(policy: Policy) -> list[str]:
    """What an operator must know before applying the manifests: where they fall short of the
    ``restricted`` Pod Security level (checked on the rendered pod, not asserted)."""
    pods = [p for p in (pod_of(d) for d in manifests(policy, suffix="check")) if p is not None]
    out = [f"allocation: the pods are not restricted-ready: {why}" for p in pods for why in restricted_violations(p)]
    if policy.allocation.host_path is not None and policy.allocation.host_path.rstrip("/") == "":
        out.append("allocation.host_path: / mounts the node's whole root filesystem into every pod")
    return out


class _PlainDumper(yaml.SafeDumper):
    """No anchors and aliases (``&id001``): every manifest reads on its own."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render_docs(docs: list[dict[str, Any]]) -> str:
    """Manifests as one multi-document YAML stream."""
    return yaml.dump_all(docs, Dumper=_PlainDumper, sort_keys=False)


def render(policy: Policy, *, cron: bool = False, suffix: str | None = None) -> str:
    """The policy's manifests as one multi-document YAML stream."""
    return render_docs(manifests(policy, cron=cron, suffix=suffix))


__all__ = ["MIN_VERSION", "PORT", "base_name", "manifests", "pod_of", "render", "render_docs", "warnings_for"]
