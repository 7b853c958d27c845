"""What auto-resume would pick today, and whether that would work.

Frameworks resume from a pointer, not from "the newest complete checkpoint": a ``latest``
file or symlink (DeepSpeed and many scripts), Megatron's
``latest_checkpointed_iteration.txt``, Hugging Face's highest ``checkpoint-N`` directory
(complete or not), torchtitan's highest ``step-N`` that holds ``.metadata``. A pointer ahead
of the data, or at a half-written save, makes a resume fail or silently restart from step 0.
"""

from __future__ import annotations

import os
from typing import Any

from drill.discover import CheckpointRef, Discovery, IncompleteSave, step_of
from drill.findings import CheckResult, Finding, Severity
from drill.storage import Storage

NAME = "resume"
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"


def _f(code: str, subject: str, message: str, severity: Severity = Severity.ERROR, **kw: Any) -> Finding:
    return Finding(check=NAME, code=code, severity=severity, subject=subject, message=message, **kw)


def _read_pointer(storage: Storage, root: str, name: str) -> str | None:
    """The target a pointer file or symlink names, relative to the root."""
    path = os.path.join(root, name)
    if os.path.islink(path):
        return os.path.basename(os.readlink(path).rstrip("/"))
    try:
        with storage.open(storage.child(root, name)) as f:
            return f.read(4096).decode("utf-8", "replace").strip()
    except (FileNotFoundError, IsADirectoryError):
        return None
    except OSError:
        return None


def _judge(
    pointer: str, target: str, by_name: dict[str, CheckpointRef | IncompleteSave], newest: CheckpointRef | None
) -> tuple[list[Finding], bool]:
    ref = by_name.get(target)
    if isinstance(ref, CheckpointRef):
        return [], True
    if isinstance(ref, IncompleteSave):
        return [
            _f(
                "pointer-incomplete",
                pointer,
                f"{pointer} points at {target}, an incomplete save ({ref.reason}): auto-resume would fail to load it",
                hint=f"point it at the newest complete checkpoint ({newest.name})" if newest else None,
            )
        ], False
    step = step_of(target) or (int(target) if target.isdigit() else None)
    if newest is not None and step is not None and newest.step is not None and step > newest.step:
        return [
            _f(
                "pointer-ahead",
                pointer,
                f"{pointer} names step {step}, ahead of the newest complete checkpoint (step {newest.step}): "
                "auto-resume would find no data there and may silently restart from step 0",
                expected=newest.name,
                actual=target,
            )
        ], False
    return [_f("pointer-dangling", pointer, f"{pointer} points at {target!r}, which is not a checkpoint here: auto-resume would fail")], False


def check_resume(storage: Storage, discovery: Discovery) -> CheckResult:
    root = discovery.root
    by_name: dict[str, CheckpointRef | IncompleteSave] = {c.name: c for c in discovery.checkpoints}
    by_name.update({s.name: s for s in discovery.incomplete})
    newest = discovery.checkpoints[-1] if discovery.checkpoints else None
    findings: list[Finding] = []
    evidence: dict[str, Any] = {"pointers": {}}
    verdicts = []
    try:
        here = {e.name for e in storage.list(root)}
        if "://" not in root:  # a dangling `latest` symlink is not listed, but is a finding
            here |= {n for n in os.listdir(root) if os.path.islink(os.path.join(root, n))}
    except (NotADirectoryError, FileNotFoundError):
        here = set()

    for name in ("latest", "latest.txt"):
        target = _read_pointer(storage, root, name) if name in here else None
        if target is not None:
            f, ok = _judge(name, target, by_name, newest)
            findings += f
            evidence["pointers"][name] = {"target": target, "works": ok}
            verdicts.append((name, target, ok))

    tracker = _read_pointer(storage, root, MEGATRON_TRACKER) if MEGATRON_TRACKER in here else None
    if tracker is not None:
        target = "release" if tracker == "release" else (f"iter_{int(tracker):07d}" if tracker.isdigit() else tracker)
        f, ok = _judge(MEGATRON_TRACKER, target, by_name, newest)
        findings += f
        evidence["pointers"][MEGATRON_TRACKER] = {"target": target, "works": ok}
        verdicts.append((MEGATRON_TRACKER, target, ok))

    hf = [(s, n) for n, s in ((n, step_of(n)) for n in by_name if n.startswith("checkpoint-")) if s is not None]
    if hf:
        highest = max(hf)[1]
        ok = isinstance(by_name[highest], CheckpointRef)
        evidence["pointers"]["highest checkpoint-N (Hugging Face)"] = {"target": highest, "works": ok}
        verdicts.append(("Hugging Face's get_last_checkpoint", highest, ok))
        if not ok:
            findings.append(
                _f(
                    "newest-incomplete",
                    highest,
                    f"Hugging Face's auto-resume picks the highest checkpoint-N, {highest}, which is incomplete "
                    f"({by_name[highest].reason}): resume_from_checkpoint=True would fail",  # type: ignore[union-attr]
                )
            )
    elif discovery.incomplete and newest is not None:
        newer = [s for s in discovery.incomplete if s.step is not None and newest.step is not None and s.step > newest.step]
        if newer:
            lost = max(s.step for s in newer) - newest.step  # type: ignore[operator]
            findings.append(
                _f(
                    "newest-incomplete",
                    newer[-1].name,
                    f"the newest save, {newer[-1].name}, is incomplete ({newer[-1].reason}): auto-resume would fall back "
                    f"to {newest.name} and lose up to {lost} steps",
                    severity=Severity.WARNING,
                )
            )
    if not verdicts and newest is not None:
        verdicts.append(("newest complete checkpoint", newest.name, True))
    evidence["would_resume_from"] = [{"by": by, "target": t, "works": ok} for by, t, ok in verdicts]
    if not verdicts:
        summary = "no checkpoint a resume could use"
    else:
        summary = "; ".join(f"{by} → {t} ({'works' if ok else 'would fail'})" for by, t, ok in verdicts)
    return CheckResult(name=NAME, summary=summary, findings=findings, evidence=evidence)
