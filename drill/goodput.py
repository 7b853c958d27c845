"""What checkpointing and restarts cost a training run: the Young/Daly model.

For a job that blocks ``C`` seconds per checkpoint, fails every ``M`` seconds on average and
takes ``R`` seconds to restart (reschedule, restore, first step), checkpointing every ``τ``
seconds wastes, as a fraction of wall-clock time (first order, valid while C ≪ τ ≪ M)::

    waste(τ) = C/τ  +  (τ/2 + R)/M          τ* = √(2·C·M)   (Young 1974; Daly 2006)

C/τ is time spent saving, τ/2·M the work lost per failure (half an interval on average), R/M
the time spent restarting. ``R`` is what a restore drill measures.

``M`` defaults to the failure rate Meta reported for Llama 3 405B — 419 unexpected
interruptions in 54 days on 16,384 GPUs — scaled as 1/N to N GPUs (failures are per
component, so a job's MTBF shrinks with its size).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

LLAMA3_INTERRUPTIONS = 419
LLAMA3_DAYS = 54
LLAMA3_GPUS = 16_384
LLAMA3_MTBF_HOURS = LLAMA3_DAYS * 24 / LLAMA3_INTERRUPTIONS
"""≈ 3.09 h between interruptions at 16,384 GPUs."""


class GoodputError(ValueError):
    """An input the model cannot use; the message names it."""


def mtbf_hours_for(gpus: int) -> float:
    """The Llama 3 405B failure rate scaled to ``gpus`` GPUs."""
    return LLAMA3_MTBF_HOURS * LLAMA3_GPUS / gpus


@dataclass(frozen=True, slots=True)
class GoodputRow:
    gpus: int
    mtbf_hours: float
    blocking_s: float
    restart_s: float
    interval_s: float
    optimal_interval: bool
    """True when ``interval_s`` is Young/Daly's τ*, False when it was given."""
    waste_fraction: float
    checkpoint_fraction: float
    """C/τ: time blocked saving."""
    rework_fraction: float
    """τ/2M: work redone after failures."""
    restart_fraction: float
    """R/M: time restarting — what restore latency costs."""
    wasted_gpu_hours_per_day: float
    """Every part together: GPU-hours a day spent not training."""
    checkpoint_stall_gpu_hours_per_day: float
    """The C/τ part: GPUs idle while the blocking save runs."""
    rework_gpu_hours_per_day: float
    restart_gpu_hours_per_day: float
    """The R/M part: what restore latency costs."""
    checkpoint_stall_cost_per_day: float | None
    """The blocking saves' idle GPUs, priced (16,384 GPUs at $2.35/GPU-h, 60 s every 15 min: ≈$61.6K)."""
    checkpoint_stall_cost_per_year: float | None
    rework_cost_per_day: float | None
    restart_cost_per_day: float | None
    total_waste_cost_per_day: float | None
    total_waste_cost_per_year: float | None

    @property
    def checkpoints_per_day(self) -> float:
        return 86400 / self.interval_s

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @property
    def valid(self) -> bool:
        """Inside the model's first-order regime (τ well below the MTBF, waste below 1)."""
        return self.interval_s < self.mtbf_hours * 3600 and self.waste_fraction < 1


def _positive(name: str, value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise GoodputError(f"{name} must be a positive number, not {value:g}")
    return float(value)


def goodput(
    *,
    gpus: int,
    blocking_s: float,
    restart_s: float,
    mtbf_hours: float | None = None,
    interval_s: float | None = None,
    price_per_gpu_hour: float | None = None,
) -> GoodputRow:
    """One row of the model; raises :class:`GoodputError` for inputs it cannot use."""
    if isinstance(gpus, bool) or int(gpus) != gpus or gpus < 1:
        raise GoodputError(f"--gpus must be a whole number of GPUs, at least 1, not {gpus}")
    c = _positive("--blocking-s (the blocking checkpoint time C)", blocking_s)
    if not math.isfinite(restart_s) or restart_s < 0:
        raise GoodputError(f"--restart-s must be zero or more seconds, not {restart_s:g}")
    m_hours = _positive("--mtbf-hours", mtbf_hours) if mtbf_hours is not None else mtbf_hours_for(int(gpus))
    m = m_hours * 3600
    tau = _positive("--interval-s", interval_s) if interval_s is not None else math.sqrt(2 * c * m)
    if price_per_gpu_hour is not None and (not math.isfinite(price_per_gpu_hour) or price_per_gpu_hour < 0):
        raise GoodputError(f"--price-per-gpu-hour must be zero or more, not {price_per_gpu_hour:g}")
    save, rework, restart = c / tau, tau / 2 / m, restart_s / m
    waste = save + rework + restart
    gpu_hours_per_day = int(gpus) * 24
    cost = (
        (lambda share: share * gpu_hours_per_day * price_per_gpu_hour)
        if price_per_gpu_hour is not None
        else (lambda share: None)
    )
    total_day = cost(waste)
    return GoodputRow(
        gpus=int(gpus),
        mtbf_hours=m_hours,
        blocking_s=c,
        restart_s=float(restart_s),
        interval_s=tau,
        optimal_interval=interval_s is None,
        waste_fraction=waste,
        checkpoint_fraction=save,
        rework_fraction=rework,
        restart_fraction=restart,
        wasted_gpu_hours_per_day=waste * gpu_hours_per_day,
        checkpoint_stall_gpu_hours_per_day=save * gpu_hours_per_day,
        rework_gpu_hours_per_day=rework * gpu_hours_per_day,
        restart_gpu_hours_per_day=restart * gpu_hours_per_day,
        checkpoint_stall_cost_per_day=cost(save),
        checkpoint_stall_cost_per_year=None if cost(save) is None else cost(save) * 365,  # type: ignore[operator]
        rework_cost_per_day=cost(rework),
        restart_cost_per_day=cost(restart),
        total_waste_cost_per_day=total_day,
        total_waste_cost_per_year=None if total_day is None else total_day * 365,
    )


def table(
    *,
    gpus: list[int],
    blocking_s: list[float],
    restart_s: list[float],
    mtbf_hours: float | None = None,
    interval_s: float | None = None,
    price_per_gpu_hour: float | None = None,
) -> list[GoodputRow]:
    """Every combination of the repeated inputs, GPUs outermost."""
    return [
        goodput(
            gpus=n,
            blocking_s=c,
            restart_s=r,
            mtbf_hours=mtbf_hours,
            interval_s=interval_s,
            price_per_gpu_hour=price_per_gpu_hour,
        )
        for n in gpus
        for c in blocking_s
        for r in restart_s
    ]


@dataclass(frozen=True, slots=True)
class MeasuredRestart:
    """R for the model, from drills: the p95 time to first step, optionally scaled."""

    restart_s: float
    drills: int
    p95_ttfs_s: float
    scaled: bool
    how: str


def measured_restart(
    samples: list[tuple[float, float | None]], *, checkpoint_bytes: int | None = None, bandwidth: float | None = None
) -> MeasuredRestart:
    """``samples``: (time to first step, restore latency) per drill, seconds.

    Without scaling R is the p95 time to first step. With ``checkpoint_bytes`` and
    ``bandwidth`` (bytes/s, aggregate over the ranks that restore), the part of each first step
    that is not the restore is kept and the restore is replaced by reading the full-size
    checkpoint at that bandwidth: R = p95(ttfs − restore) + bytes / bandwidth.
    """
    from drill.stats import percentile

    ttfs = [t for t, _ in samples]
    if not ttfs:
        raise GoodputError("no drill with a time to first step to measure R from")
    p95 = percentile(ttfs, 95)
    assert p95 is not None
    if checkpoint_bytes is None and bandwidth is None:
        return MeasuredRestart(p95, len(ttfs), p95, False, f"p95 time to first step of {len(ttfs)} drill(s)")
    if not checkpoint_bytes or not bandwidth or checkpoint_bytes <= 0 or bandwidth <= 0:
        raise GoodputError("--checkpoint-bytes and --restore-bandwidth go together, both positive")
    rest = percentile([t - (r or 0.0) for t, r in samples], 95)
    assert rest is not None
    read = checkpoint_bytes / bandwidth
    how = f"p95 of (time to first step − restore) over {len(ttfs)} drill(s), {rest:.1f} s, + {checkpoint_bytes:,} bytes at {bandwidth:,.0f} B/s, {read:.1f} s"
    return MeasuredRestart(max(0.0, rest) + read, len(ttfs), p95, True, how)


__all__ = [
    "LLAMA3_MTBF_HOURS",
    "GoodputError",
    "GoodputRow",
    "MeasuredRestart",
    "goodput",
    "measured_restart",
    "mtbf_hours_for",
    "table",
]
