"""Rank numbers from a checkpoint are counted, never enumerated (drill.ranks)."""

from __future__ import annotations

import pytest

from drill.findings import PER_CODE, Finding, Severity, bounded
from drill.ranks import MAX_WORLD, absent, each_missing, plausible_world


@pytest.mark.parametrize(
    ("present", "upto", "listed", "total"),
    [
        ([0, 2, 5], 7, [1, 3, 4, 6], 4),
        ([], 3, [0, 1, 2], 3),
        ([0, 1, 2], 3, [], 0),
        ([5, -1], 2, [0, 1], 2),  # ranks outside the range are not the range's
        ([2, 2, 0], 3, [1], 1),
        ([0], 0, [], 0),
    ],
)
def test_absent_lists_and_counts_the_gaps(present: list[int], upto: int, listed: list[int], total: int) -> None:
    assert absent(present, upto) == (listed, total)


def test_absent_counts_a_billion_without_enumerating_it() -> None:
    listed, total = absent([0, 10**18], 10**18 + 1)  # enumerating would never end
    assert listed == list(range(1, PER_CODE)) and total == 10**18 - 1


def _finding(rank: int) -> Finding:
    return Finding(
        check="contract", code="rng-rank-missing", severity=Severity.ERROR, message=f"rank {rank}", rank=rank
    )


def test_each_missing_is_what_bounding_every_finding_would_give() -> None:
    missing = absent([0], 1000)
    short = each_missing(missing, _finding)
    full = bounded([_finding(r) for r in range(1, 1000)])
    assert [f.message for f in short] == [f.message for f in full]
    assert short[-1].message == "and 900 more rng-rank-missing findings like those above (999 in all)"
    assert each_missing(absent([0, 1], 2), _finding) == []


@pytest.mark.parametrize(
    ("claimed", "world"), [(8, 8), (MAX_WORLD, MAX_WORLD), (MAX_WORLD + 1, None), (0, None), (-4, None), (None, None)]
)
def test_a_world_size_past_any_runs_is_unknown(claimed: int | None, world: int | None) -> None:
    assert plausible_world(claimed) == world


CAPPED = r"""
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 31, 1 << 31))
resource.setrlimit(resource.RLIMIT_CPU, (120, 120))
import torch
from drill.checks.contract import check_partitions
from drill.formats.canonical import Layout
fp32 = torch.zeros(4)
opt = {
    "partitions.rank_0.0.fp32": fp32, "partitions.rank_0.0.exp_avg": fp32,
    "partitions.rank_0.999999999.fp32": fp32, "partitions.rank_0.999999999.exp_avg": fp32,
}
findings, _ = check_partitions(opt, Layout(format="deepspeed", required=(), saved_ranks=[0, 1]))
missing = [f for f in findings if f.code == "optimizer-partition-missing"]
print(len(missing), missing[-1].message)
"""


def test_a_group_number_in_a_key_costs_what_one_key_costs() -> None:
    """A flat partition keyed ``rank_0.999999999``: the groups missing before it are counted
    (each was checked for every rank), within a 2 GiB and 120 CPU-second cap."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", CAPPED], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    count, message = done.stdout.split(" ", 1)
    assert int(count) == 101 and "(999999998 in all)" in message, done.stdout  # rank 1's, then rank 0's groups


def test_a_shard_named_for_a_far_rank_costs_what_one_file_costs(demo_run) -> None:  # type: ignore[no-untyped-def]
    """A DCP checkpoint whose index is unreadable names its shards from the listing: a stray
    ``__999999999_0.distcp`` makes the ranks before it missing — counted, under a 2 GiB cap."""
    from tests.conftest import capped_drill

    ckpt = demo_run / "step-30"
    (ckpt / ".metadata").write_bytes(b"not a pickle")
    (ckpt / "drill-manifest.json").unlink()
    (ckpt / "__999999999_0.distcp").write_bytes(b"x")
    code, document = capped_drill("verify", str(ckpt))
    missing = [f for f in document["findings"] if f["code"] == "file-missing"]
    assert code == 1 and len(missing) == 100 and "in all)" in missing[-1]["message"], missing[-3:]
