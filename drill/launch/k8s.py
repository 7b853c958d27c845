"""A policy's drill as Kubernetes manifests for a cluster admin to ``kubectl apply``.

An **Indexed Job** (``batch/v1``, ``completionMode: Indexed``) with one pod per node and a
headless Service: built into Kubernetes since 1.24, nothing to install. (A JobSet or a
Kubeflow PyTorchJob would add gang scheduling and restart policies, but each needs its
controller running in the cluster; an Indexed Job runs anywhere.) Each pod runs ``torchrun``
with ``--node-rank`` = its completion index and pod 0 — stable DNS name
``<job>-0.<service>`` — as the rendezvous host; torchrun starts ``ranks_per_node`` ranks of
``drill run --policy`` (mounted from a ConfigMap). The record database URL comes from the
Secret ``drill-database`` (key ``url``), never from the manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from drill.launch.slurm import time_limit_minutes
from drill.policy.model import Policy

PORT = 29500
SECRET = "drill-database"


def manifests(policy: Policy) -> list[dict[str, Any]]:
    a = policy.allocation
    name = f"drill-{policy.name.lower().replace('_', '-').replace('.', '-')}"[:52]
    labels = {"app.kubernetes.io/name": "drill", "drill/policy": name}
    config = {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-policy", "labels": labels},
        "data": {"policy.yaml": Path(policy.path).read_text() if policy.path else ""},
    }  # fmt: skip
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels},
        "spec": {"clusterIP": "None", "selector": {"job-name": name}, "ports": [{"name": "rendezvous", "port": PORT}]},
    }  # fmt: skip
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "completionMode": "Indexed",
            "completions": a.nodes,
            "parallelism": a.nodes,
            "backoffLimit": 0,
            "activeDeadlineSeconds": time_limit_minutes(policy) * 60,
            "template": {"metadata": {"labels": labels}, "spec": _pod(policy, name)},
        },
    }
    for doc in (config, service, job):
        if a.namespace:
            doc["metadata"]["namespace"] = a.namespace  # type: ignore[index]
    return [config, service, job]


def _pod(policy: Policy, name: str) -> dict[str, Any]:
    a = policy.allocation
    command = [
        "torchrun", f"--nnodes={a.nodes}", f"--nproc-per-node={a.ranks_per_node}", "--node-rank=$(JOB_COMPLETION_INDEX)",
        f"--master-addr={name}-0.{name}", f"--master-port={PORT}", "-m", "drill", "run", "--policy", "/etc/drill/policy.yaml", "--quiet",
    ]  # fmt: skip
    container: dict[str, Any] = {
        "name": "drill",
        "image": a.image,
        "command": command,
        "env": [
            {"name": "DRILL_DATABASE_URL", "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "url"}}},
            {"name": "DRILL_JOB_ID", "value": f"k8s:{name}"},
        ],
        "ports": [{"containerPort": PORT, "name": "rendezvous"}],
        "volumeMounts": [{"name": "policy", "mountPath": "/etc/drill", "readOnly": True}],
    }
    if a.gpus_per_node:
        container["resources"] = {"limits": {"nvidia.com/gpu": a.gpus_per_node}}
    return {
        "subdomain": name,
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": [{"name": "policy", "configMap": {"name": f"{name}-policy"}}],
    }


def render(policy: Policy, *, db_url: str | None = None) -> str:
    """The manifests as one multi-document YAML stream (``db_url`` is never written: the pods
    read the Secret)."""
    return yaml.safe_dump_all(manifests(policy), sort_keys=False)


__all__ = ["PORT", "SECRET", "manifests", "render"]
