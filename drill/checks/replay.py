"""The ``replay`` check: a :class:`~drill.replay.run.ReplayOutcome` as evidence."""

from __future__ import annotations

from typing import Any

from drill.checks import CheckInputs
from drill.findings import CheckResult, Finding, Severity
from drill.replay.run import DIVERGED, ERROR, NOT_REPLAYABLE, NOT_RUN, PASSED, REFUSED, ReplayOutcome

NAME = "replay"


def replay_rows(outcome: ReplayOutcome) -> list[dict[str, Any]]:
    """Each replayed step next to the original run's values, as recorded in the database."""
    div = outcome.divergence
    rows = []
    for ref, got in outcome.steps:
        rows.append(
            {
                "step": got.step,
                "reference_loss": ref.loss if ref else None,
                "loss": got.loss,
                "reference_grad_norm": ref.grad_norm if ref else None,
                "grad_norm": got.grad_norm,
                "reference_batch": ref.batch if ref else None,
                "batch": got.batch,
                "matches": ref is not None and (div is None or got.step < div.step),
            }
        )
    return rows


def _evidence(outcome: Any) -> dict[str, Any]:
    return {
        "verdict": outcome.verdict,
        "entrypoint": outcome.entrypoint,
        "entrypoint_source": outcome.entrypoint_source,
        "reference": outcome.reference_source,
        "tolerance": None
        if outcome.tolerance is None
        else {"rtol": outcome.tolerance.rtol, "atol": outcome.tolerance.atol},
        "environment": outcome.environment,
        "ranks": outcome.ranks,
        "saved_ranks": outcome.saved_ranks,
        "restore_seconds": outcome.restore_seconds,
        "seconds": outcome.seconds,
        "steps": replay_rows(outcome),
    }


def check_replay(inputs: CheckInputs) -> CheckResult:
    outcome = inputs.replay
    assert outcome is not None
    evidence = _evidence(outcome)
    if outcome.verdict == PASSED:
        return CheckResult(name=NAME, summary=outcome.reason, evidence=evidence)
    if outcome.verdict == NOT_RUN:
        return CheckResult(
            name=NAME,
            summary=f"not run — a gap in the evidence, not a pass: {outcome.reason}",
            evidence=evidence,
            skipped=True,
        )
    if outcome.verdict == NOT_REPLAYABLE:
        finding = Finding(
            check=NAME,
            code="not-replayable",
            severity=Severity.INFO,
            subject=None,
            message=f"not replayable: {outcome.reason}",
            hint=outcome.hint
            or "log steps with drill.sdk.StepLog and name a replay entrypoint (--replay module:function)",
        )
        return CheckResult(
            name=NAME,
            summary=f"not replayable — a gap in the evidence, not a pass: {outcome.reason}",
            findings=[finding],
            evidence=evidence,
            skipped=True,
        )
    if outcome.verdict == DIVERGED:
        div = outcome.divergence
        finding = Finding(
            check=NAME,
            code=f"replay-diverged-{div.what}" if div else "replay-diverged",
            severity=Severity.ERROR,
            subject=div.where if div else None,
            message=f"{outcome.reason}: a resume from this checkpoint would not continue the original run",
            expected=div.expected if div else None,
            actual=div.actual if div else None,
        )
        return CheckResult(name=NAME, summary=f"diverged: {outcome.reason}", findings=[finding], evidence=evidence)
    if outcome.verdict == REFUSED:
        finding = Finding(
            check=NAME,
            code="replay-entrypoint-refused",
            severity=Severity.ERROR,
            subject=None,
            message=outcome.reason,
            hint="if that code is yours, name it explicitly: --replay module:function (or replay.entrypoint in the policy)",
        )
        return CheckResult(name=NAME, summary=f"refused: {outcome.reason}", findings=[finding], evidence=evidence)
    assert outcome.verdict == ERROR
    evidence["traceback"] = outcome.traceback
    finding = Finding(check=NAME, code="replay-error", severity=Severity.ERROR, subject=None, message=outcome.reason)
    return CheckResult(
        name=NAME, summary=f"error: {outcome.reason}", findings=[finding], evidence=evidence, errored=True
    )
