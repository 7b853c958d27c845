"""Whether a valid policy can run *here*: what ``drill policy check`` warns about.

A policy can be valid and still fail on this host — a run directory that is not mounted, a
CUDA device on a CPU-only host, an alert secret that is not set in this environment. These are
warnings, not errors: the policy may be meant for another host. (A location no host could
address is the policy's error: :mod:`drill.policy.model`.)
"""

from __future__ import annotations

import os

from drill.policy.model import Policy
from drill.replay.run import entrypoint_findable
from drill.storage import StorageError, scheme_of, storage_for


def warnings_for(policy: Policy) -> list[str]:
    """One sentence per reason this policy would not run on this host."""
    out: list[str] = []
    for name in ("root", "durable", "scratch"):
        uri = getattr(policy.checkpoints, name)
        if uri:
            out += _reachable(f"checkpoints.{name}", uri, policy)
    if policy.device.startswith("cuda"):
        from drill.device import cuda_usable

        if not cuda_usable():
            out.append(f"device: {policy.device}, but this host has no usable CUDA device")
    webhook = policy.alerts.webhook
    if webhook and webhook.startswith("env:") and not os.environ.get(webhook[4:]):
        out.append(f"alerts.webhook: ${webhook[4:]} is not set in this environment: alerts would not be delivered")
    out += _launcher(policy)
    entry = policy.replay.entrypoint
    if policy.replay.enabled and entry and not entrypoint_findable(entry, policy.checkpoints.root):
        out.append(f"replay.entrypoint: {entry.rpartition(':')[0]} is not importable here")
    return out


def _launcher(policy: Policy) -> list[str]:
    import shutil

    a = policy.allocation
    out = []
    if a.launcher == "slurm" and shutil.which("sbatch") is None:
        out.append("allocation.launcher: slurm, but sbatch is not on PATH here: submit from a Slurm login node")
    for name in ("rendezvous", "log_dir"):
        path = getattr(a, name)
        if a.launcher == "slurm" and path and not os.path.isdir(path):
            out.append(f"allocation.{name}: {path} is not a directory on this host")
    return out


def _reachable(field: str, uri: str, policy: Policy) -> list[str]:
    try:
        storage = storage_for(uri, dict(policy.checkpoints.s3))
    except StorageError as exc:
        return [f"{field}: {exc}"]
    if scheme_of(uri) == "s3":  # never a network call from a check: are there credentials at all?
        return _s3_credentials(field, uri)
    try:
        storage.stat(uri)
    except OSError as exc:
        return [f"{field}: {uri} cannot be reached from this host ({exc.strerror or exc})"]
    return []


def _s3_credentials(field: str, root: str) -> list[str]:
    env = os.environ
    shared = os.path.expanduser(env.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"))
    if (
        env.get("AWS_ACCESS_KEY_ID")
        or env.get("AWS_PROFILE")
        or env.get("AWS_WEB_IDENTITY_TOKEN_FILE")
        or os.path.exists(shared)
    ):
        return []
    return [
        f"{field}: {root}: no AWS credentials in this environment or ~/.aws (an instance role may still provide them)"
    ]
