"""The demo run's restorable state: the SDK's ``Stateful`` helpers (:mod:`drill.sdk.state`)
and the demo's learning-rate schedule."""

from __future__ import annotations

import math

from drill.sdk.state import ModelState, OptimizerState, PerRank, RNGState, TrainState


class WarmupCosine:
    """Linear warm-up then cosine decay to 10%; a callable object, so LambdaLR saves it."""

    def __init__(self, warmup: int, total: int) -> None:
        self.warmup = warmup
        self.total = total

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


__all__ = ["ModelState", "OptimizerState", "PerRank", "RNGState", "TrainState", "WarmupCosine"]
