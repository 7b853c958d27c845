"""What auto-resume would pick today, and whether that would work.

Frameworks resume from a pointer, not from "the newest complete checkpoint": a ``latest``
file or symlink (DeepSpeed and many scripts), Megatron's
``latest_checkpointed_iteration.txt``, Hugging Face's highest ``checkpoint-N`` directory
(complete or not), torchtitan's highest ``step-N`` that holds ``.metadata``. A pointer ahead
of the data, or at a half-written save, makes a resume fail or silently restart from step 0.
"""

from __future__ import annotations

from typing import Any

from drill.checks import CheckInputs
from drill.discover import CheckpointRef, Discovery, IncompleteSave, step_of
from drill.findings import CheckResult, Finding, Severity, not_run
from drill.storage import Entry, Storage

NAME = "resume"
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"


def _f(code: str, subject: str, message: str, severity: Severity = Severity.ERROR, **kw: Any) -> Finding:
    return Finding(check=NAME, code=code, severity=severity, subject=subject, message=message, **kw)


def _read_pointer(storage: Storage, root: str, entry: Entry) -> str | None:
    """The target a pointer file or symlink names, relative to the root (None: unreadable)."""
    if entry.link_target is not None:
        return entry.link_target.rstrip("/").rsplit("/", 1)[-1]
    if not entry.is_file:
        return None
    try:
        with storage.open(storage.child(root, entry.name)) as f:
            return f.read(4096).decode("utf-8", "replace").strip()
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
    for name, target in _pointers(inputs.storage, discovery.root, here):
        f, ok = _judge(name, target, by_name, newest)
        findings += f
        evidence["pointers"][name] = {"target": target, "works": ok}
        verdicts.append((name, target, ok))
    hf = _hf_highest(by_name)
    if hf is not None:
        highest, ok = hf
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
    else:
        findings += _newest_incomplete(discovery, newest)
    if not verdicts and newest is not None:
        verdicts.append(("newest complete checkpoint", newest.name, True))
    evidence["would_resume_from"] = [{"by": by, "target": t, "works": ok} for by, t, ok in verdicts]
    summary = "; ".join(f"{by} → {t} ({'works' if ok else 'would fail'})" for by, t, ok in verdicts) or "no checkpoint a resume could use"
    return CheckResult(name=NAME, summary=summary, findings=findings, evidence=evidence)


def _pointers(storage: Storage, root: str, here: dict[str, Entry]) -> list[tuple[str, str]]:
    """(pointer, target) for every resume pointer in the run root that names something."""
    out = []
    for name in ("latest", "latest.txt", MEGATRON_TRACKER):
        target = _read_pointer(storage, root, here[name]) if name in here else None
        if not target:
            continue
        if name == MEGATRON_TRACKER and target != "release":
            target = f"iter_{int(target):07d}" if target.isdigit() else target
        out.append((name, target))
    return out


def _hf_highest(by_name: dict[str, CheckpointRef | IncompleteSave]) -> tuple[str, bool] | None:
    """Hugging Face's ``get_last_checkpoint`` takes the highest checkpoint-N, complete or not."""
    hf = [(s, n) for n, s in ((n, step_of(n)) for n in by_name if n.startswith("checkpoint-")) if s is not None]
    if not hf:
        return None
    highest = max(hf)[1]
    return highest, isinstance(by_name[highest], CheckpointRef)


def _newest_incomplete(discovery: Discovery, newest: CheckpointRef | None) -> list[Finding]:
    if not discovery.incomplete or newest is None or newest.step is None:
        return []
    newer = [s for s in discovery.incomplete if s.step is not None and s.step > newest.step]
    if not newer:
        return []
    lost = max(s.step for s in newer) - newest.step  # type: ignore[operator]
    return [
        _f(
            "newest-incomplete",
            newer[-1].name,
            f"the newest save, {newer[-1].name}, is incomplete ({newer[-1].reason}): auto-resume would fall back "
            f"to {newest.name} and lose up to {lost} steps",
            severity=Severity.WARNING,
        )
    ]
