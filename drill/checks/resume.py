"""What auto-resume would pick today, and whether that would work.

Frameworks resume from a pointer, not from "the newest complete checkpoint": a ``latest``
file or symlink (DeepSpeed and many scripts), and whatever each format's trainer follows
(:meth:`drill.formats.base.Format.pointers`: Megatron's tracker file, Hugging Face's highest
``checkpoint-N``, complete or not). A pointer ahead of the data, or at a half-written save,
makes a resume fail or silently restart from step 0.
"""

from __future__ import annotations

from typing import Any

from drill import formats
from drill.checkpoints import CheckpointRef, Discovery, IncompleteSave, step_of
from drill.checks import CheckInputs
from drill.discover import is_link_pointer
from drill.findings import CheckResult, Finding, Severity, not_run
from drill.formats.base import read_pointer
from drill.storage import Entry, Storage
from drill.units import decimal

NAME = "resume"
GENERIC_POINTERS = ("latest", "latest.txt", "latest.json", "latest_checkpoint", "last_checkpoint")
"""Pointer files many trainers and scripts write beside their checkpoints (DeepSpeed's ``latest``);
besides them, every symlink at the run's top not named by a step is a pointer (Composer's
``latest-rank0.pt``, Lightning's ``last.ckpt`` link, a ``latest -> step-8`` directory link)."""


def _f(code: str, subject: str, message: str, severity: Severity = Severity.ERROR, **kw: Any) -> Finding:
    return Finding(check=NAME, code=code, severity=severity, subject=subject, message=message, **kw)


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
    step = step_of(target) or decimal(target)
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
    return [
        _f(
            "pointer-dangling",
            pointer,
            f"{pointer} points at {target!r}, which is not a checkpoint here: auto-resume would fail",
        )
    ], False


def check_resume(inputs: CheckInputs) -> CheckResult:
    if inputs.discovery is None:
        return not_run(NAME, "the run root could not be listed")
    discovery = inputs.discovery
    by_name: dict[str, CheckpointRef | IncompleteSave] = {c.name: c for c in discovery.checkpoints}
    by_name.update({s.name: s for s in discovery.incomplete})
    newest = discovery.checkpoints[-1] if discovery.checkpoints else None
    try:
        here = {e.name: e for e in inputs.storage.list(discovery.root)}
    except OSError:
        here = {}
    findings: list[Finding] = []
    evidence: dict[str, Any] = {"pointers": {}}
    verdicts = []
    named = _pointers(inputs.storage, discovery.root, here, discovery)
    for name, target in named:
        f, ok = _judge(name, target, by_name, newest)
        findings += f
        evidence["pointers"][name] = {"target": target, "works": ok}
        verdicts.append((name, target, ok))
    if _newest_name(discovery) not in {t for _, t in named}:  # a pointer at it already says so
        findings += _newest_incomplete(discovery, newest)
    if not verdicts and newest is not None:
        verdicts.append(("newest complete checkpoint", newest.name, True))
    evidence["would_resume_from"] = [{"by": by, "target": t, "works": ok} for by, t, ok in verdicts]
    summary = (
        "; ".join(f"{by} → {t} ({'works' if ok else 'would fail'})" for by, t, ok in verdicts)
        or "no checkpoint a resume could use"
    )
    return CheckResult(name=NAME, summary=summary, findings=findings, evidence=evidence)


def _pointers(
    storage: Storage, root: str, here: dict[str, Entry], found: Discovery | None = None
) -> list[tuple[str, str]]:
    """(who follows it, target) for every resume pointer in the run root that names something:
    the generic ``latest`` files, then each format's own."""
    named = [*GENERIC_POINTERS, *sorted(n for n, e in here.items() if is_link_pointer(e) and n not in GENERIC_POINTERS)]
    out = [(name, target) for name in named if (target := read_pointer(storage, root, here.get(name)))]
    return out + [p for p in formats.pointers(storage, root, here, found or Discovery(root=root)) if p not in out]


def _newest_name(discovery: Discovery) -> str | None:
    saves = [(s.step, s.name) for s in discovery.saves if s.step is not None]
    return max(saves)[1] if saves else None


def _newest_incomplete(discovery: Discovery, newest: CheckpointRef | None) -> list[Finding]:
    if not discovery.incomplete or newest is None or newest.step is None:
        return []
    newer = [s for s in discovery.incomplete if s.step is not None and s.step > newest.step]
    if not newer:
        return []
    lost = max(s.step for s in newer if s.step is not None) - newest.step
    return [
        _f(
            "newest-incomplete",
            newer[-1].name,
            f"the newest save, {newer[-1].name}, is incomplete ({newer[-1].reason}): auto-resume would fall back "
            f"to {newest.name} and lose up to {lost} steps",
            severity=Severity.WARNING,
        )
    ]
