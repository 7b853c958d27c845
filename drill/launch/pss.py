"""The Kubernetes Pod Security Standards' ``restricted`` level as checks on a pod spec
(https://kubernetes.io/docs/concepts/security/pod-security-standards/, v1.30 rules): what the
admission controller of a namespace labelled ``pod-security.kubernetes.io/enforce: restricted``
would refuse. :func:`restricted_violations` returns the violations; none means the pod is
admitted. ``drill submit`` and ``drill policy check`` ask it of every pod drill renders: the
manifests' "restricted-ready" is checked, never assumed."""

from __future__ import annotations

from typing import Any

RESTRICTED_VOLUMES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    found: list[str] = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            found.append(f"{key} is set")
    pod_sc = pod.get("securityContext") or {}
    for vol in pod.get("volumes") or []:
        kind = next(k for k in vol if k != "name")
        if kind not in RESTRICTED_VOLUMES:
            where = f" ({vol[kind].get('path')})" if kind == "hostPath" and isinstance(vol[kind], dict) else ""
            found.append(f"volume {vol['name']}: {kind}{where} is not allowed (only at the privileged level)")
    containers = [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]
    for c in containers:
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("privileged"):
            found.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation must be false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            found.append(f"{name}: capabilities must drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            found.append(f"{name}: adds capabilities {sorted(set(caps['add']) - {'NET_BIND_SERVICE'})}")
        if not (
            sc.get("runAsNonRoot") is True or (sc.get("runAsNonRoot") is None and pod_sc.get("runAsNonRoot") is True)
        ):
            found.append(f"{name}: runAsNonRoot must be true")
        for ctx, where in ((sc, name), (pod_sc, "pod")):
            if ctx.get("runAsUser") == 0:
                found.append(f"{where}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccompProfile must be RuntimeDefault or Localhost")
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                found.append(f"{name}: hostPort")
    return found


__all__ = ["restricted_violations"]
