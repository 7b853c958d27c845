"""Sampling is a pure function; the coverage ledger makes repeated sampled drills cover all."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from drill import history
from drill.integrity.sampling import SampleSpec, SampleSpecError, parse_sample, select_sample
from tests.conftest import drill

SIZES = {f"__{i}_0.distcp": 1000 + i for i in range(40)}


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("all", SampleSpec("all")),
        ("3/7", SampleSpec("bucket", n=3, t=7)),
        ("25%", SampleSpec("fraction", fraction=0.25)),
        ("2GiB", SampleSpec("bytes", nbytes=2 * 1024**3)),
        ("500MB", SampleSpec("bytes", nbytes=500 * 1000**2)),
        ("auto", SampleSpec("auto", fraction=0.25)),
        ("auto:10%", SampleSpec("auto", fraction=0.10)),
        ("auto:1GiB", SampleSpec("auto", nbytes=1024**3)),
    ],
)
def test_parse(text: str, spec: SampleSpec) -> None:
    assert parse_sample(text) == spec


@pytest.mark.parametrize("text", ["0/3", "4/3", "a/b", "0%", "101%", "lots", "-5MB", "auto:", "1/0"])
def test_parse_rejects(text: str) -> None:
    with pytest.raises(SampleSpecError):
        parse_sample(text)


def test_buckets_partition_the_files() -> None:
    seen: list[str] = []
    for n in range(1, 6):
        seen += select_sample(SampleSpec("bucket", n=n, t=5), SIZES)
    assert sorted(seen) == sorted(SIZES)  # every file exactly once over t drills


def test_selection_is_deterministic_and_respects_the_budget() -> None:
    a = select_sample(parse_sample("25%"), SIZES)
    assert a == select_sample(parse_sample("25%"), SIZES)
    chosen = sum(SIZES[p] for p in a)
    assert 0.25 * sum(SIZES.values()) <= chosen < 0.25 * sum(SIZES.values()) + 1040


def test_always_included() -> None:
    sizes = {**SIZES, ".metadata": 10}
    for spec in ("1/40", "1%", "auto:1%"):
        assert ".metadata" in select_sample(parse_sample(spec), sizes, always=[".metadata"])


def test_auto_takes_the_least_recently_verified_first() -> None:
    now = datetime.now(timezone.utc)
    last = {p: now - timedelta(hours=i) for i, p in enumerate(SIZES)}  # later index = older
    never = "__new_0.distcp"
    picked = select_sample(parse_sample("auto:5%"), {**SIZES, never: 1000}, last)
    assert picked == {never, "__39_0.distcp"}  # the never-verified, then the least recently verified


def test_a_byte_budget_takes_whole_files_closest_to_it() -> None:
    sizes = {"a": 300, "b": 600, "c": 100}
    picked = select_sample(parse_sample("50%"), sizes)
    assert abs(sum(sizes[p] for p in picked) - 500) <= 200  # about half, never all three
    assert len(picked) < 3


def test_auto_sampled_drills_cover_the_checkpoint(demo_run: Path, sqlite_url: str) -> None:
    coverage = []
    for _ in range(3):
        outcome = drill(demo_run, sqlite_url, sample="auto:10%")
        assert outcome.status == "passed"
        integrity = next(c for c in outcome.checks if c.name == "integrity")
        assert "sampled" in integrity.summary
        coverage.append(integrity.evidence["coverage"]["percent"])
    assert coverage[0] < 100.0 and coverage[-1] == 100.0
    (latest,) = history(db=sqlite_url, limit=1)
    assert latest.sample == "auto (10%)"


def test_a_failed_file_leaves_the_coverage(demo_run: Path, sqlite_url: str) -> None:
    assert drill(demo_run, sqlite_url).status == "passed"
    shard = demo_run / "step-30" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[100] ^= 1
    shard.write_bytes(data)
    outcome = drill(demo_run, sqlite_url)
    integrity = next(c for c in outcome.checks if c.name == "integrity")
    assert outcome.status == "failed" and integrity.evidence["coverage"]["percent"] < 100.0
