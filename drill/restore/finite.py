"""NaN/Inf and all-zero scans of restored tensors, per key: what the contract check judges.

A distributed restore scans each rank's share where it lies and sends only these figures.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def _scannable(key: str, t: Any) -> bool:
    """Every floating-point tensor, whatever part it belongs to (step counters aside)."""
    return (
        isinstance(t, torch.Tensor)
        and t.device.type != "meta"
        and t.is_floating_point()
        and t.numel() > 0
        and not key.endswith(".step")
    )


def finite_stats(t: torch.Tensor, mode: str) -> list[int]:
    """[elements scanned, NaN, Inf, 1 if all scanned elements are zero] for one tensor (or chunk)."""
    view = t.detach().reshape(-1)
    if mode == "sampled" and view.numel() > 65536:
        view = view[:: view.numel() // 65536]
    # One reduction pass, no temporary: the norm is NaN or Inf if any element is, and zero
    # only if all are. Only a non-finite norm (or one that overflowed) pays for the exact count.
    norm = float(torch.linalg.vector_norm(view, dtype=torch.float32 if view.element_size() < 4 else None))
    if math.isfinite(norm):
        return [view.numel(), 0, 0, int(view.numel() > 1 and norm == 0.0)]
    finite = torch.isfinite(view)
    if bool(finite.all()):  # the norm overflowed on finite values
        return [view.numel(), 0, 0, 0]
    nan = int(torch.isnan(view).sum())
    return [view.numel(), nan, int((~finite).sum()) - nan, 0]


def scan(tensors: list[tuple[str, Any]], mode: str) -> dict[str, list[int]]:
    """Per key, the stats of every scannable tensor or chunk of it, summed."""
    out: dict[str, list[int]] = {}
    for key, t in tensors:
        if mode == "off" or not _scannable(key, t):
            continue
        got = finite_stats(t, mode)
        have = out.get(key)
        out[key] = got if have is None else [have[0] + got[0], have[1] + got[1], have[2] + got[2], have[3] & got[3]]
    return out


__all__ = ["finite_stats", "scan"]
