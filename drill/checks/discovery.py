"""The ``discover`` check: which checkpoints the run retains, and which one this drill restores."""

from __future__ import annotations

from typing import Any

from drill.checks import CheckInputs
from drill.findings import CheckResult, Finding, Severity

NAME = "discover"


def check_discover(inputs: CheckInputs) -> CheckResult:
    found, ref = inputs.discovery, inputs.ref
    evidence: dict[str, Any] = {"root": inputs.root}
    if found is not None:
        evidence["complete"] = [c.name for c in found.checkpoints]
        evidence["incomplete"] = [{"name": s.name, "reason": s.reason} for s in found.incomplete]
        if found.exports:
            evidence["final_export"] = found.exports
    if inputs.selection is not None:
        evidence["selection"] = inputs.selection
    missing = inputs.nothing_to_drill
    if missing is not None or found is None or ref is None:
        message = missing.message if missing is not None else f"nothing to drill under {inputs.root}"
        finding = Finding(
            check=NAME,
            code="no-checkpoint",
            severity=Severity.ERROR,
            subject=inputs.root,
            message=message,
            hint=getattr(missing, "hint", None),
        )
        return CheckResult(name=NAME, summary=message, findings=[finding], evidence=evidence)
    text = f"{len(found.checkpoints)} complete checkpoint(s) retained; selected {ref.name}"
    if found.incomplete:
        text += f"; {len(found.incomplete)} incomplete save(s) skipped: " + ", ".join(s.name for s in found.incomplete)
    findings = []
    if found.exports:
        text += f"; beside them a final model export ({', '.join(found.exports)}), not a resumable checkpoint"
        findings.append(
            Finding(
                check=NAME,
                code="final-export",
                severity=Severity.INFO,
                subject=inputs.root,
                message=f"{', '.join(found.exports)} at the top of the run are a final model export (weights), "
                "not a resumable checkpoint: a resume uses the checkpoint directories",
            )
        )
    return CheckResult(name=NAME, summary=text, findings=findings, evidence=evidence)
