"""A rank's share of a distributed restore, and rank 0's merge of every rank's report.

Each rank restores its files (:mod:`drill.formats.dcp_shard`), scans what it holds for
NaN/Inf, and sends rank 0 a :class:`RankReport`: what it read (with the digests), what failed,
its timings, and a light view of its state — values and small tensors as they are, large
tensors as their shape and dtype (``meta`` tensors). Rank 0 merges the reports into one
:class:`~drill.restore.RestoreResult` that the checks judge as if one process had restored
everything, plus the per-rank figures the record keeps.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from drill.dist.context import DistContext, RankFailure
from drill.failpoints import failpoint
from drill.formats.base import RestoreContext, one_line
from drill.restore import FileRead, ItemFailure, RestoreResult
from drill.restore.finite import scan
from drill.restore.partition import Shard, balance

SMALL_TENSOR_BYTES = 64 << 10
"""Tensors up to this size travel to rank 0 whole (step counters, RNG states); larger ones as shape and dtype."""


@dataclass(slots=True)
class RankReport:
    rank: int
    host: str
    pid: int
    files: list[FileRead] = field(default_factory=list)
    failures: list[ItemFailure] = field(default_factory=list)
    light: dict[str, Any] = field(default_factory=dict)
    finite: dict[str, list[int]] = field(default_factory=dict)
    tensors: int = 0
    tensor_bytes: int = 0
    values: int = 0
    read_seconds: float = 0.0
    load_seconds: float = 0.0
    seconds: float = 0.0
    error: str | None = None
    result: RestoreResult | None = None
    """Rank 0's own result (the index, inventory and layout come from it); never sent."""

    @property
    def bytes(self) -> int:
        return sum(f.bytes_read for f in self.files)


def _light(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.numel() * value.element_size() > SMALL_TENSOR_BYTES:
        return torch.empty(value.shape, dtype=value.dtype, device="meta")
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value


def rank_report(
    rank: int, result: RestoreResult | None, seconds: float, error: str | None, finite_scan: str
) -> RankReport:
    report = RankReport(rank, socket.gethostname(), os.getpid(), seconds=seconds, error=error)
    if result is None:
        return report
    report.files, report.failures = result.files, result.failures
    report.light = {k: _light(v) for k, v in result.state.items()}
    report.finite = scan([*result.state.items(), *((k, t) for k, _, t in result.chunks)], finite_scan)
    report.tensors, report.tensor_bytes, report.values = (
        result.tensors_loaded,
        result.tensor_bytes,
        result.values_loaded,
    )
    report.read_seconds, report.load_seconds = result.read_seconds, result.load_seconds
    return report


def restore_share(
    dist: DistContext, adapter: Any, storage: Any, ref: Any, ctx: RestoreContext, finite_scan: str
) -> list[RankReport] | None:
    """Restore this rank's share; on rank 0, every rank's report (rank 0's carrying its result)."""
    started = time.perf_counter()
    result, error = None, None
    shared = adapter.restores_across_ranks
    if shared:
        ctx.shard = Shard(dist.rank, dist.world, lambda objs: dist.scatter(objs, "index"))
    try:
        if shared or dist.is_root:  # a format that cannot share its restore is restored by rank 0 alone
            result = adapter.restore(storage, ref, ctx)
    except Exception as exc:  # noqa: BLE001 - a rank's failure goes to rank 0, which records it
        error = one_line(exc)
    failpoint("restored")
    report = rank_report(dist.rank, result, time.perf_counter() - started, error, finite_scan)
    reports = dist.gather(report, "restored")
    if reports is not None:
        reports[0] = report
        report.result = result
    return reports


def merge(reports: list[RankReport]) -> RestoreResult:
    """One result, as if one process had restored everything; :class:`RankFailure` when a rank failed."""
    failed = [r for r in reports if r.error]
    if failed:
        raise RankFailure(
            "; ".join(f"rank {r.rank} on {r.host} failed its share: {r.error}" for r in failed),
            [r.rank for r in failed],
        )
    root = reports[0].result
    assert root is not None
    merged = RestoreResult(uri=root.uri, format=root.format, device=root.device)
    merged.index, merged.inventory, merged.layout, merged.structure = (
        root.index,
        root.inventory,
        root.layout,
        root.structure,
    )
    merged.metadata_error, merged.metadata_code, merged.index_file = (
        root.metadata_error,
        root.metadata_code,
        root.index_file,
    )
    merged.files = sorted((f for r in reports for f in r.files), key=lambda f: f.relative_path)
    merged.failures = [f for r in reports for f in r.failures]
    merged.finite = {}
    for r in reports:
        for key, (n, nan, inf, zero) in r.finite.items():
            have = merged.finite.get(key, [0, 0, 0, 1])
            merged.finite[key] = [have[0] + n, have[1] + nan, have[2] + inf, have[3] & zero]
        merged.tensors_loaded += r.tensors
        merged.tensor_bytes += r.tensor_bytes
        merged.values_loaded += r.values
    merged.state = _merged_state(reports, root)
    merged.read_seconds = max(r.read_seconds for r in reports)
    merged.load_seconds = max(r.load_seconds for r in reports)
    return merged


def _merged_state(reports: list[RankReport], root: RestoreResult) -> dict[str, Any]:
    """Every entry: small values as loaded, large or sharded tensors as meta tensors of the
    full shape (the checks need their shape; their values were scanned on their ranks)."""
    state: dict[str, Any] = {}
    for r in reports:
        state.update(r.light)
    loaded = {f.key for f in root.failures}
    for info in root.inventory:
        if info.key not in state and info.key not in loaded:
            state[info.key] = torch.empty(
                info.shape, dtype=getattr(torch, info.dtype.removeprefix("torch.")), device="meta"
            )
    return state


def figures(reports: list[RankReport], shard: Shard | None) -> dict[str, Any]:
    """Per-rank bytes, files and seconds; the byte balance; the slowest rank and why."""
    ranks = [
        {
            "rank": r.rank, "host": r.host, "pid": r.pid, "files": len([f for f in r.files if f.relative_path != ".metadata"]),
            "bytes": r.bytes, "read_seconds": round(r.read_seconds, 4), "load_seconds": round(r.load_seconds, 4),
            "seconds": round(r.seconds, 4), "throughput_bps": r.bytes / r.seconds if r.seconds > 0 else None,
        }
        for r in reports
    ]  # fmt: skip
    slowest = max(reports, key=lambda r: r.seconds)
    loads = [r.bytes for r in reports]
    share = slowest.bytes / max(1, sum(loads))
    parts = {
        "waiting on storage": slowest.read_seconds,
        "deserializing": slowest.load_seconds,
        "reading the index and waiting on the other ranks": max(
            0.0, slowest.seconds - slowest.read_seconds - slowest.load_seconds
        ),
    }
    most = max(parts, key=parts.__getitem__)
    why = f"read {slowest.bytes:,} bytes ({100 * share:.0f}% of the checkpoint); most of its {slowest.seconds:.2f} s {most} ({parts[most]:.2f} s)"
    return {
        "world_size": len(reports),
        "ranks": ranks,
        "balance": balance(loads),
        "assignment": shard.assignment if shard is not None else None,
        "slowest": {"rank": slowest.rank, "seconds": round(slowest.seconds, 4), "why": why},
        "bytes_total": sum(loads),
    }


__all__ = ["RankReport", "figures", "merge", "rank_report", "restore_share"]
