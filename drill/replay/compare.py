"""Step-by-step comparison of a replay with the original run: a pure function."""

from __future__ import annotations

import math
from dataclasses import dataclass

from drill.runlog.steplog import StepRecord


@dataclass(frozen=True, slots=True)
class Tolerance:
    rtol: float = 0.0
    atol: float = 0.0

    def __post_init__(self) -> None:
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"--{name} must be a finite number ≥ 0, not {value!r}")

    def close(self, a: float, b: float) -> bool:
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return abs(a - b) <= self.atol + self.rtol * abs(b)


SAME_DEVICE = Tolerance(0.0, 0.0)
"""Same device type, same thread count, deterministic kernels: bit for bit."""
CROSS_DEVICE = Tolerance(rtol=1e-3, atol=1e-5)
"""CPU vs GPU kernels round differently; a resumed run that is right agrees to ~1e-5."""


@dataclass(frozen=True, slots=True)
class Divergence:
    step: int
    what: str
    """``data`` (batch fingerprint), ``loss``, ``grad_norm``, ``classes`` (a class or module the
    checkpoint needs is gone from the code: ``expected``), or ``keys`` (the objects do not take
    the checkpoint's: ``expected`` the keys it holds that they do not take, ``actual`` those they
    ask for that it lacks)."""
    expected: object
    actual: object
    delta: float | None = None
    rank: int | None = None
    """The rank whose own log it is (None: the run's log)."""

    @property
    def where(self) -> str:
        """``step 11`` or ``step 11 on rank 3``."""
        return f"step {self.step}" + (f" on rank {self.rank}" if self.rank is not None else "")

    def describe(self) -> str:
        if self.what == "classes":
            return f"the checkpoint needs {self.expected}, which the code no longer has"
        if self.what == "keys":
            return f"keys differ at step {self.step}: the checkpoint holds {self.expected!r} untaken; the objects ask for {self.actual!r}"
        if self.what == "data":
            return f"data order diverged at {self.where}: batch {self.actual}, the original run saw {self.expected}"
        rel = f" (relative {self.delta:.2e})" if self.delta is not None else ""
        logged = "the original run logged" if self.rank is None else "that rank logged"
        return f"{self.what} diverged at {self.where}: {self.actual!r}, {logged} {self.expected!r}{rel}"


def compare_steps(reference: dict[int, StepRecord], replayed: list[StepRecord], tol: Tolerance) -> Divergence | None:
    """The first step where the replay left the original run, or None.

    Data order must match exactly (where both sides fingerprinted their batches); loss and
    grad norm within ``tol``.
    """
    for got in replayed:
        ref = reference.get(got.step)
        if ref is None:
            continue
        if ref.batch is not None and got.batch is not None and ref.batch != got.batch:
            return Divergence(got.step, "data", ref.batch, got.batch)
        if not tol.close(got.loss, ref.loss):
            return Divergence(got.step, "loss", ref.loss, got.loss, _rel(got.loss, ref.loss))
        if ref.grad_norm is not None and got.grad_norm is not None and not tol.close(got.grad_norm, ref.grad_norm):
            return Divergence(got.step, "grad_norm", ref.grad_norm, got.grad_norm, _rel(got.grad_norm, ref.grad_norm))
    return None


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b) if b else abs(a - b)
