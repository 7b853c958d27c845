"""Which files a sampled verification hashes: pure functions, as restic's --read-data-subset.

Forms of ``--sample``:

- ``all``: every file (the default: sampling never weakens a drill silently);
- ``n/t``: the files in bucket n of t (bucket = xxh3-64 of the path mod t) — run 1/t … t/t
  on successive nights and every file has been verified once;
- ``P%`` / ``SIZE`` (``500MB``, ``2GiB``): a deterministic selection of about that many bytes;
- ``auto`` (25% of bytes), ``auto:P%``, ``auto:SIZE``: the bytes least recently verified
  first, from the coverage ledger, so repeated drills cover everything.

Files a restore cannot do without (``always``, e.g. DCP's ``.metadata``) are always included.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import xxhash

from drill.units import decimal, parse_size


class SampleSpecError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class SampleSpec:
    kind: Literal["all", "bucket", "fraction", "bytes", "auto"]
    n: int = 0
    t: int = 0
    fraction: float = 1.0
    nbytes: int = 0

    def __str__(self) -> str:
        if self.kind == "bucket":
            return f"{self.n}/{self.t}"
        if self.kind == "fraction":
            return f"{self.fraction * 100:g}%"
        if self.kind == "bytes":
            return f"{self.nbytes} bytes"
        if self.kind == "auto":
            return f"auto ({self.fraction * 100:g}%)" if not self.nbytes else f"auto ({self.nbytes} bytes)"
        return "all"

    @property
    def is_full(self) -> bool:
        return self.kind == "all"


def _budget(text: str) -> tuple[float, int]:
    if text.endswith("%"):
        try:
            pct = float(text[:-1])
        except ValueError:
            raise SampleSpecError(f"bad percentage {text!r}") from None
        if not 0 < pct <= 100:  # NaN fails this too
            raise SampleSpecError(f"percentage {text!r} must be in (0, 100]")
        return pct / 100, 0
    try:
        return 0.0, parse_size(text)
    except ValueError as exc:
        raise SampleSpecError(f"{exc}, a percentage (25%), n/t or auto") from None


def parse_sample(text: str) -> SampleSpec:
    """Parse ``all | n/t | P% | SIZE | auto[:P%|:SIZE]``; raises :class:`SampleSpecError`."""
    t = text.strip()
    if t == "all":
        return SampleSpec("all")
    if t == "auto":
        return SampleSpec("auto", fraction=0.25)
    if t.startswith("auto:"):
        fraction, nbytes = _budget(t[5:])
        return SampleSpec("auto", nbytes=nbytes) if nbytes else SampleSpec("auto", fraction=fraction)
    if "/" in t:
        a, _, b = t.partition("/")
        n, of = decimal(a), decimal(b)
        if n is None or of is None or not 1 <= n <= of:
            raise SampleSpecError(f"bad subset {text!r}: expected n/t with 1 ≤ n ≤ t, e.g. 3/7")
        return SampleSpec("bucket", n=n, t=of)
    fraction, nbytes = _budget(t)
    return SampleSpec("fraction", fraction=fraction) if fraction else SampleSpec("bytes", nbytes=nbytes)


def _key(path: str) -> int:
    return xxhash.xxh3_64_intdigest(path.encode())


def _take(ordered: Iterable[str], sizes: Mapping[str, int], budget: int) -> set[str]:
    """Files in order, each taken only if it brings the bytes closer to the budget (whole files
    are the unit: 50% of three files is about half the bytes, not all of them)."""
    chosen: set[str] = set()
    used = 0
    for path in ordered:
        size = sizes[path]
        if not chosen or abs(used + size - budget) < abs(used - budget):
            chosen.add(path)
            used += size
        if used >= budget:
            break
    return chosen


def select_sample(
    spec: SampleSpec,
    sizes: Mapping[str, int],
    last_verified: Mapping[str, datetime] | None = None,
    always: Iterable[str] = (),
) -> set[str]:
    """The paths to verify out of ``sizes`` (path → bytes) under ``spec``."""
    always = {p for p in always if p in sizes}
    if spec.kind == "all":
        return set(sizes)
    if spec.kind == "bucket":
        return {p for p in sizes if _key(p) % spec.t == spec.n - 1} | always
    total = sum(sizes.values())
    budget = spec.nbytes or max(1, int(total * spec.fraction))
    if spec.kind == "auto":
        seen = last_verified or {}
        # Never-verified first (oldest possible time), then least recently; ties by path hash.
        ordered = sorted(sizes, key=lambda p: (seen[p].timestamp() if p in seen else float("-inf"), _key(p)))
    else:
        ordered = sorted(sizes, key=_key)
    return _take(ordered, sizes, budget) | always
