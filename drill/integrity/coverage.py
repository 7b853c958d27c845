"""The coverage ledger after a verification: which bytes are proven, and how recently.

Pure functions; the record store applies them (see :meth:`drill.records.store.Records.apply_coverage`).
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import xxhash

from drill.findings import CheckResult, Severity
from drill.text import lossless
from drill.units import earlier

if TYPE_CHECKING:
    from drill.integrity.verify import IntegrityPlan


@dataclass(frozen=True, slots=True)
class CoverageUpdate:
    sealed: dict[str, tuple[int, str]]
    """Every sealed file → (size, digest): what coverage is measured against."""
    verified: dict[str, tuple[int, str]]
    """Files whose bytes just matched their seal."""
    broken: frozenset[str]
    """Files that just failed: earlier proofs of them no longer hold."""


def coverage_update(plan: IntegrityPlan, integrity: CheckResult) -> CoverageUpdate:
    assert plan.manifest is not None
    sealed = {f.path: (f.size, f.xxh3_128) for f in plan.manifest.files}
    proven = integrity.evidence.get("verified", [])
    if len(proven) == len(sealed) and sealed.keys() == set(proven):  # every sealed file: a copy
        verified = dict(sealed)
    else:
        verified = {p: sealed[p] for p in proven if p in sealed}
    if integrity.evidence.get("authenticated") is False and plan.key is not None:
        verified = {}  # bytes that match a manifest the key does not vouch for prove nothing
    broken = frozenset(
        str(f.subject) for f in integrity.findings if f.severity is Severity.ERROR and f.subject in sealed
    )
    return CoverageUpdate(sealed, verified, broken)


@dataclass(frozen=True, slots=True)
class LedgerWrites:
    """What a ledger writes for one update, given the proofs it holds (path → (size, digest)):
    each of its writers (:mod:`drill.records.lite`, :mod:`drill.records.ledger`) asks here."""

    redate_all: bool
    """Every stored proof was just proven again, of the same bytes: one statement re-dates them
    all (a nightly verify of an unchanged checkpoint of 20,000 files writes no row one by one)."""
    write: list[str]
    """Files whose proof is new or of other bytes (with ``redate_all``), else every verified one."""
    forget: list[str]
    """Files whose stored proofs no longer hold."""


def ledger_writes(update: CoverageUpdate, stored: Mapping[str, tuple[int, str]]) -> LedgerWrites:
    if stored == update.verified:  # a nightly verify of an unchanged checkpoint: one comparison
        return LedgerWrites(bool(stored), [], [])
    same = [p for p, proof in update.verified.items() if stored.get(p) == proof]
    redate_all = bool(stored) and len(same) == len(stored)
    write = [p for p in update.verified if stored.get(p) != update.verified[p]] if redate_all else list(update.verified)
    return LedgerWrites(redate_all, write, sorted(update.broken & stored.keys()))


def proofs_fingerprint(proofs: Mapping[str, tuple[int, str]]) -> str:
    """The fingerprint of a ledger's proofs (path → (size, digest)) as a database stores them
    (paths :func:`~drill.text.lossless`), in path order: the xxh3-128 of the paths, the sizes
    and the digests. Each ledger keeps it beside the proofs (every write sets it anew), so a
    verification whose proofs have that fingerprint made exactly the proofs stored — a nightly
    verification of an unchanged checkpoint — and re-dates them all in one row."""
    joined = "\0".join(proofs)
    as_stored = lossless(joined)
    paths = list(proofs) if as_stored is joined else as_stored.split("\0") if proofs else []
    values = list(proofs.values())
    if any(map(operator.gt, paths, paths[1:])):  # not in path order already (a seal's files are)
        rows = sorted(zip(paths, values, strict=True))
        paths, values = [p for p, _ in rows], [v for _, v in rows]
        as_stored = "\0".join(paths)
    h = xxhash.xxh3_128()
    h.update(as_stored.encode())
    h.update(array("q", [size for size, _ in values]).tobytes())
    h.update("".join([digest for _, digest in values]).encode())
    return h.hexdigest()


def proven_again(update: CoverageUpdate, stored_fingerprint: str | None) -> bool:
    """Whether the proofs a ledger holds (their fingerprint, as it keeps it) are exactly the
    proofs just made: then its writers re-date them all in one statement (:data:`AGAIN`), and
    read and write no row."""
    return bool(update.verified) and stored_fingerprint == proofs_fingerprint(update.verified)


AGAIN = LedgerWrites(True, [], [])
"""The writes for proofs made again (:func:`proven_again`): every one re-dated, nothing else."""


def fingerprint_after(stored: Mapping[str, tuple[int, str]], update: CoverageUpdate, writes: LedgerWrites) -> str:
    """The fingerprint of the proofs a ledger holds once ``writes`` are made, from those it
    held (``stored``, paths as stored)."""
    proofs = dict(stored)
    proofs.update((lossless(p), update.verified[p]) for p in writes.write)
    for p in writes.forget:
        proofs.pop(p, None)
    return proofs_fingerprint(proofs)


def share_after(
    update: CoverageUpdate,
    rows: Iterable[tuple[str, Any, str, Any]],
    writes: LedgerWrites,
    now: datetime,
    parse: Callable[[Any], datetime],
    days: float,
) -> float:
    """The share of the sealed bytes proven within ``days`` of ``now`` once the writes are made,
    from the stored rows (path, size, digest, time as stored) read before them. Where every
    sealed file was just proven, that is all of them, and no row is looked at."""
    if update.verified == update.sealed and days >= 0:
        return 1.0
    proofs = proofs_after(update, {p: (d, at) for p, _, d, at in rows}, writes, now, parse)
    return fresh_share(update, proofs, earlier(now, days * 86400))


def proofs_after(
    update: CoverageUpdate,
    stored: Mapping[str, tuple[str, Any]],
    writes: LedgerWrites,
    now: datetime,
    parse: Callable[[Any], datetime],
) -> dict[str, tuple[str, datetime]]:
    """Path → (digest, when) once the writes are made: what :func:`fresh_share` measures.
    ``stored``: path → (digest, time as stored), the time read with ``parse`` only for the
    proofs that stand as they were."""
    forgotten = set(writes.forget)
    proofs = {
        p: (digest, parse(at)) for p, (digest, at) in stored.items() if p not in update.verified and p not in forgotten
    }
    proofs.update((p, (digest, now)) for p, (_, digest) in update.verified.items())
    return proofs


def fresh_share(update: CoverageUpdate, proofs: Mapping[str, tuple[str, datetime]], since: datetime) -> float:
    """The share of the sealed bytes whose last proof (path → (digest, when)) is of the digest
    sealed now and no older than ``since``."""
    total = sum(size for size, _ in update.sealed.values())
    if not total:
        return 1.0
    fresh = sum(
        size
        for path, (size, digest) in update.sealed.items()
        if path in proofs and proofs[path][0] == digest and proofs[path][1] >= since
    )
    return fresh / total


def annotate_coverage(integrity: CheckResult, share: float | None, days: float) -> None:
    """Add "N% of this checkpoint's bytes verified within the last D days" to the check."""
    if share is None:
        return
    integrity.evidence["coverage"] = {"days": days, "percent": round(100 * share, 1)}
    integrity.summary += f"; {100 * share:.0f}% of this checkpoint's bytes verified within the last {days:g} days"
