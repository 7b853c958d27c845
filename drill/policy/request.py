"""A policy, turned into the :class:`~drill.pipeline.request.DrillRequest` for one drill."""

from __future__ import annotations

from drill.checks import Expectations
from drill.pipeline.request import DrillRequest
from drill.policy.model import Policy
from drill.replay import ReplaySpec, Tolerance


def request_from_policy(policy: Policy, trigger: str) -> DrillRequest:
    r = policy.replay
    tolerance = None if r.rtol is None and r.atol is None else Tolerance(r.rtol or 0.0, r.atol or 0.0)
    return DrillRequest(
        root=policy.checkpoints.root,
        storage_options=dict(policy.checkpoints.s3),
        durable=policy.checkpoints.durable,
        cold=policy.checkpoints.cold,
        scratch=policy.checkpoints.scratch,
        device=policy.device,
        trigger=trigger,
        expectations=Expectations(
            required_parts=policy.contract.require,
            allow_missing=policy.contract.allow_missing,
            finite_scan=policy.contract.finite_scan,
        ),
        sample=policy.integrity.sample,
        require_sealed=policy.integrity.require_sealed,
        key_file=policy.integrity.key_file,
        coverage_days=policy.integrity.coverage_days,
        format=policy.checkpoints.format,
        allow_classes=policy.contract.allow_classes,
        replay=ReplaySpec(
            entrypoint=r.entrypoint,
            steps=r.steps,
            timeout=r.timeout,
            tolerance=tolerance,
            enabled=r.enabled,
            ranks=r.ranks,
            python=r.python,
        ),
        policy=policy.name,
        policy_file=policy.path or None,
        selection=policy.selection,
        keep_last=policy.checkpoints.keep_last,
        slo=policy.slo,
        memory_budget=policy.limits.memory,
        # The drill ends itself — recorded, with the phase it was in — a little before the
        # parent would have to kill it at the policy's limit.
        timeout=max(1.0, policy.limits.timeout - min(30.0, 0.1 * policy.limits.timeout)),
    )
