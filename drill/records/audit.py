"""The tamper-evident drill log: every closed drill record sealed into a hash chain.

When a drill's record is closed — by the drill itself, by the parent that saw it die, by
orphan recovery, or by a spooled verdict delivered later — its content (the drill row, its
checks with their evidence, its replayed steps and the checkpoint's URI, as canonical JSON)
is digested with SHA-256 and appended to ``audit_log`` in the same transaction, as entry
``seq``::

    hash[seq] = SHA-256("drill-audit/2" | seq | drill id | content digest | sealed at | hash[seq-1]
                        | closed by | the seq this entry supersedes)

With an audit key (``$DRILL_AUDIT_KEY_FILE`` or ``$DRILL_AUDIT_KEY``) each entry also carries
an HMAC-SHA256 of the same message. :func:`verify_chain` recomputes every link and every
record's digest: an edited record, an edited, reordered or deleted entry, a deleted drill row
or a row inserted outside drill is named.

A record is sealed once. The one exception is a guess: orphan recovery closes a drill whose
process is gone as ``aborted``, and the truth may arrive later (the spooled verdict, or the
parent that saw the process die); that entry names the one it supersedes. Any other second
entry for a record is ``record-resealed``: a record edited, then sealed again to hide it.
Entries written before drill 0.5 (``drill-audit/1``: no "closed by") are verified as they
were written; one of those after a newer entry is a forgery (``entry-downgraded``).

Fail closed: with an audit key, an entry without its HMAC or with another key's is an error
(before ``keyed_from``, the entry an operator named when the key was introduced, it is
counted, not failed); closed records with no chain at all, or no chain table, are errors. Deleting the newest records together with their
entries leaves a shorter chain that is still consistent — which is why reports print the chain
head: an auditor who pinned it (``drill audit verify --head HASH``) sees it vanish. Without a
key, someone with write access to the database could recompute the whole chain; the pinned
head or a key they do not hold is what stops that.

Alerts and the coverage ledger are not sealed: they are written after the record closes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from drill.errors import one_line
from drill.findings import Finding, Severity
from drill.records.models import AuditEntry, Checkpoint, CheckRecord, Drill, ReplayStep
from drill.verdict import DrillStatus

GENESIS = "0" * 64
VERSION = "drill-audit/2"
LEGACY = "drill-audit/1"
PROVISIONAL = "orphan-recovery"
"""Who closes a record on a guess (its process is gone): the one closure a later entry may supersede."""
CLOSERS = ("drill", "spool", "parent", "error-close", PROVISIONAL)
KEY_FILE_ENV = "DRILL_AUDIT_KEY_FILE"
KEY_ENV = "DRILL_AUDIT_KEY"
_PG_LOCK = 0x64726C6C  # "drll": one advisory lock serializes appends on PostgreSQL


def load_audit_key() -> bytes | None:
    """The audit key from the environment, or None; raises ``SealKeyError`` when unusable."""
    from drill.integrity.keys import load_key

    return load_key(file_env=KEY_FILE_ENV, env=KEY_ENV, what="audit key")


def key_id(key: bytes) -> str:
    return hmac.new(key, b"drill audit key id", hashlib.sha256).hexdigest()[:16]


# -- content --------------------------------------------------------------------------------
def _plain(row: Mapping[str, Any], drop: tuple[str, ...]) -> dict[str, Any]:
    return {k: (v.astimezone(timezone.utc).isoformat() if isinstance(v, datetime) else v) for k, v in row.items() if k not in drop}


LATER_COLUMNS = ("options",)
"""Columns of ``drills`` added after ``drill-audit/1`` entries were written: their digests never
covered them, so verifying one of those leaves them out."""


def _digest(drill: Mapping[str, Any], checkpoint_uri: str | None, checks: Iterable[Mapping[str, Any]], steps: Iterable[Mapping[str, Any]], legacy: bool = False) -> str:
    doc = {
        "drill": _plain(drill, ("checkpoint_id", *(LATER_COLUMNS if legacy else ()))),
        "checkpoint": checkpoint_uri,
        "checks": [_plain(c, ("id", "drill_id")) for c in checks],
        "replay_steps": [_plain(r, ("id", "drill_id")) for r in steps],
    }
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _message(seq: int, drill_id: int, content: str, sealed_at: datetime, prev: str, closed_by: str | None = None, supersedes: int | None = None) -> bytes:
    head = f"{seq}|{drill_id}|{content}|{sealed_at.astimezone(timezone.utc).isoformat()}|{prev}"
    if closed_by is None:  # an entry drill wrote before 0.5
        return f"{LEGACY}|{head}".encode()
    return f"{VERSION}|{head}|{closed_by}|{supersedes if supersedes is not None else '-'}".encode()


def _entry_message(e: AuditEntry) -> bytes:
    return _message(e.seq, e.drill_id, e.content_sha256, e.sealed_at, e.prev_hash, e.closed_by, e.supersedes)


def _hash(message: bytes) -> str:
    return hashlib.sha256(message).hexdigest()


class _Contents:
    """Drill records as sealed, read with plain table selects (so sealing and verifying
    digest exactly the values the database returns). A drill whose rows hold a value that
    cannot be read back (a time that is not a time, broken JSON) is ``unreadable``: it was
    edited outside drill, and the other records are still checked."""

    def __init__(self, s: Session, drill_ids: list[int] | None = None) -> None:
        d, c, r, k = Drill.__table__, CheckRecord.__table__, ReplayStep.__table__, Checkpoint.__table__
        only = (lambda col: col.in_(drill_ids)) if drill_ids is not None else (lambda col: col.isnot(None))
        self.unreadable: dict[int, str] = {}
        self.drills = {i: rows[0] for i, rows in self._rows(s, d, d.c.id, only(d.c.id), d.c.id).items()}
        self.uris = dict(s.execute(select(k.c.id, k.c.uri).where(k.c.id.in_({x["checkpoint_id"] for x in self.drills.values()} - {None}))).all())
        self.checks = self._rows(s, c, c.c.drill_id, only(c.c.drill_id), c.c.id)
        self.steps = self._rows(s, r, r.c.drill_id, only(r.c.drill_id), r.c.step, r.c.id)

    def _rows(self, s: Session, table: Any, key: Any, where: Any, *order: Any) -> defaultdict[int, list[Any]]:
        """Rows by drill; where the whole read fails on a value, drill by drill, setting
        aside the drills whose rows cannot be read."""
        out: defaultdict[int, list[Any]] = defaultdict(list)
        try:
            for row in s.execute(select(table).where(where).order_by(*order)).mappings():
                out[row[key.name]].append(row)
            return out
        except (ValueError, TypeError):
            out.clear()
        for drill_id in s.execute(select(key).where(where).distinct()).scalars():
            try:
                out[drill_id] = list(s.execute(select(table).where(where, key == drill_id).order_by(*order)).mappings())
            except (ValueError, TypeError) as exc:
                self.unreadable[drill_id] = one_line(exc)
        return out

    def digest(self, drill_id: int, legacy: bool = False) -> str | None:
        """The record's digest as sealed now, or (``legacy``) as a ``drill-audit/1`` entry sealed it."""
        row = self.drills.get(drill_id)
        if row is None:
            return None
        return _digest(row, self.uris.get(row["checkpoint_id"]), self.checks[drill_id], self.steps[drill_id], legacy)


# -- sealing --------------------------------------------------------------------------------
def seal_drill(s: Session, drill_id: int, key: bytes | None, closed_by: str = "drill") -> AuditEntry:
    """Append the closed drill ``drill_id`` to the chain, in the caller's transaction;
    ``closed_by`` says who closed it (one of :data:`CLOSERS`)."""
    assert closed_by in CLOSERS, closed_by
    s.flush()
    if s.get_bind().dialect.name == "postgresql":
        s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK})
    # On SQLite the flush above already holds the database's write lock: appends are serial.
    last = s.execute(select(AuditEntry.seq, AuditEntry.hash).order_by(AuditEntry.seq.desc()).limit(1)).first()
    seq, prev = (last[0] + 1, last[1]) if last else (1, GENESIS)
    supersedes = s.scalar(select(AuditEntry.seq).where(AuditEntry.drill_id == drill_id).order_by(AuditEntry.seq.desc()).limit(1))
    content = _Contents(s, [drill_id]).digest(drill_id)
    assert content is not None
    sealed_at = datetime.now(timezone.utc)
    message = _message(seq, drill_id, content, sealed_at, prev, closed_by, supersedes)
    entry = AuditEntry(
        seq=seq,
        drill_id=drill_id,
        content_sha256=content,
        prev_hash=prev,
        hash=_hash(message),
        mac=hmac.new(key, message, hashlib.sha256).hexdigest() if key else None,
        key_id=key_id(key) if key else None,
        sealed_at=sealed_at,
        closed_by=closed_by,
        supersedes=supersedes,
    )
    s.add(entry)
    s.flush()
    return entry


# -- verifying ------------------------------------------------------------------------------
@dataclass(slots=True)
class ChainHead:
    seq: int
    hash: str
    drill_id: int
    sealed_at: datetime

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "hash": self.hash, "drill_id": self.drill_id, "sealed_at": self.sealed_at.isoformat()}


@dataclass(slots=True)
class ChainReport:
    """What :func:`verify_chain` found."""

    entries: int = 0
    records: int = 0
    """Closed drill records checked against their latest entry."""
    head: ChainHead | None = None
    authenticated: int = 0
    """Entries whose HMAC verified under the key given."""
    unkeyed_before: int = 0
    """Entries before ``keyed_from`` that carry no HMAC of the key (sealed before it was introduced)."""
    before_chain: int = 0
    """Closed records older than the chain's first entry (recorded before drill kept one)."""
    problems: list[Finding] = field(default_factory=list)

    @property
    def intact(self) -> bool:
        return not any(p.severity is Severity.ERROR for p in self.problems)

    def to_dict(self) -> dict[str, Any]:
        return {
            "intact": self.intact,
            "entries": self.entries,
            "records": self.records,
            "authenticated": self.authenticated,
            "unkeyed_before": self.unkeyed_before,
            "before_chain": self.before_chain,
            "head": self.head.to_dict() if self.head else None,
            "problems": [p.to_dict() for p in self.problems],
        }


def _problem(code: str, subject: str, message: str, severity: Severity = Severity.ERROR) -> Finding:
    return Finding(check="audit", code=code, severity=severity, subject=subject, message=message)


def verify_chain(s: Session, *, key: bytes | None = None, head: str | None = None, keyed_from: int | None = None) -> ChainReport:
    """Recompute every link, every entry (its HMAC under ``key``, who closed it, what it
    supersedes) and every closed record's digest; name what does not match. With ``key``,
    entries from ``keyed_from`` on (all, by default) must carry that key's HMAC."""
    from sqlalchemy import inspect

    if not inspect(s.connection()).has_table(AuditEntry.__tablename__):
        return ChainReport(problems=[_problem("chain-missing", AuditEntry.__tablename__, "the audit_log table is gone: the tamper-evident log was dropped")])
    entries = _entries(s)
    contents = _Contents(s)
    report = ChainReport(entries=len(entries))
    latest: dict[int, Any] = {}
    prev_hash, prev_seq, current = GENESIS, 0, False
    for e in entries:
        if isinstance(e, _Unreadable):
            report.problems.append(_problem("entry-edited", f"entry {e.seq}", f"entry {e.seq} (drill #{e.drill_id}) holds a value drill cannot read ({e.why}): the entry was edited"))
        else:
            report.problems += _link_problems(e, prev_hash, prev_seq, key, report, keyed_from)
            report.problems += _reseal_problems(e, latest.get(e.drill_id), current)
            current = current or e.closed_by is not None
        prev_hash, prev_seq = e.hash, e.seq
        latest[e.drill_id] = e
    last = next((e for e in reversed(entries) if not isinstance(e, _Unreadable)), None)
    if last is not None:
        report.head = ChainHead(last.seq, last.hash, last.drill_id, last.sealed_at)
    first = next((e for e in entries if not isinstance(e, _Unreadable)), None)
    report.problems += _record_problems(contents, latest, first, report)
    if head is not None and not any(e.hash == head.strip().lower() for e in entries):
        report.problems.append(
            _problem("head-missing", head, f"the pinned chain head {head} is not in the chain: the log was rewritten or its newest entries deleted")
        )
    return report


@dataclass(frozen=True, slots=True)
class _Unreadable:
    """A chain entry with a value that cannot be read back: what is left of it to follow the chain."""

    seq: int
    drill_id: int
    hash: str
    content_sha256: str
    why: str
    closed_by: str | None = None


def _entries(s: Session) -> list[AuditEntry | _Unreadable]:
    """The chain in order; an entry whose values cannot all be read (edited outside drill)
    stands in with its plain columns, so the entries after it are still checked."""
    try:
        return list(s.scalars(select(AuditEntry).order_by(AuditEntry.seq)))
    except (ValueError, TypeError):
        pass
    out: list[AuditEntry | _Unreadable] = []
    plain = select(AuditEntry.seq, AuditEntry.drill_id, AuditEntry.hash, AuditEntry.content_sha256, AuditEntry.closed_by).order_by(AuditEntry.seq)
    for seq, drill_id, hash_, content, closed_by in s.execute(plain):
        try:
            out.append(s.scalars(select(AuditEntry).where(AuditEntry.seq == seq)).one())
        except (ValueError, TypeError) as exc:
            out.append(_Unreadable(seq, drill_id, hash_, content, one_line(exc), closed_by))
    return out


def _link_problems(e: AuditEntry, prev_hash: str, prev_seq: int, key: bytes | None, report: ChainReport, keyed_from: int | None) -> list[Finding]:
    out = []
    where = f"entry {e.seq} (drill #{e.drill_id})"
    if e.seq != prev_seq + 1:
        out.append(_problem("entries-missing", f"entry {e.seq}", f"entries {prev_seq + 1}..{e.seq - 1} are missing from the chain: deleted"))
    message = _entry_message(e)
    if e.prev_hash != prev_hash and e.seq == prev_seq + 1:
        out.append(_problem("link-broken", where, f"{where} does not follow the entry before it: entries were reordered, edited or replaced"))
    if _hash(message) != e.hash:
        out.append(_problem("entry-edited", where, f"{where} does not match its own hash: the entry was edited"))
    if key is not None:
        out += _mac_problems(e, message, key, report, keyed_from)
    return out


def _mac_problems(e: AuditEntry, message: bytes, key: bytes, report: ChainReport, keyed_from: int | None) -> list[Finding]:
    """Under a key every entry must be that key's: a missing or foreign HMAC is how a forger
    without the key would downgrade the chain, so it fails — unless the entry predates the
    key (``keyed_from``, named by the operator who introduced it)."""
    where = f"entry {e.seq} (drill #{e.drill_id})"
    mine = e.mac is not None and e.key_id == key_id(key)
    if mine and hmac.compare_digest(e.mac, hmac.new(key, message, hashlib.sha256).hexdigest()):
        report.authenticated += 1
        return []
    if mine:
        return [_problem("entry-forged", where, f"{where} fails its HMAC: written or rewritten by someone without the audit key")]
    if keyed_from is not None and e.seq < keyed_from:
        report.unkeyed_before += 1
        return []
    if e.mac is None:
        return [_problem("entry-unauthenticated", where, f"{where} carries no HMAC although an audit key is configured: sealed without the key, or stripped of it")]
    return [_problem("entry-other-key", where, f"{where} claims another audit key (key id {e.key_id}): not authenticated by this one")]


def _reseal_problems(e: AuditEntry, before: AuditEntry | _Unreadable | None, current: bool) -> list[Finding]:
    """A second entry for a record is legitimate only where the first was a guess (orphan
    recovery) and the entry says it supersedes it."""
    where = f"entry {e.seq} (drill #{e.drill_id})"
    if e.closed_by is None:
        return [_problem("entry-downgraded", where, f"{where} is written in the old format after newer entries: forged to dodge the reseal check")] if current else []
    if e.closed_by not in CLOSERS:
        return [_problem("entry-edited", where, f"{where} was closed by {e.closed_by!r}, which drill never writes")]
    if before is None:
        if e.supersedes is not None:
            return [_problem("link-broken", where, f"{where} claims to supersede entry {e.supersedes}, which is not this record's")]
        return []
    if isinstance(before, _Unreadable):
        return []  # the entry before it is already named as edited
    if e.supersedes != before.seq or before.closed_by != PROVISIONAL:
        how = f"closed by {before.closed_by or 'a drill before 0.5'} in entry {before.seq}"
        return [_problem("record-resealed", f"drill #{e.drill_id}", f"drill #{e.drill_id} was {how} and sealed again in entry {e.seq}: a record rewritten, then resealed to hide it")]
    return []


def _record_problems(contents: _Contents, latest: dict[int, Any], first: Any, report: ChainReport) -> list[Finding]:
    out = []
    for drill_id, e in latest.items():
        if drill_id in contents.unreadable:
            why = contents.unreadable[drill_id]
            out.append(_problem("record-edited", f"drill #{drill_id}", f"drill #{drill_id} holds a value drill cannot read ({why}): edited after it was recorded"))
            continue
        digest = contents.digest(drill_id, legacy=e.closed_by is None)
        if digest is None:
            out.append(_problem("record-deleted", f"drill #{drill_id}", f"drill #{drill_id} is in the chain (entry {e.seq}) but its record is gone: deleted"))
        elif digest != e.content_sha256:
            out.append(_problem("record-edited", f"drill #{drill_id}", f"drill #{drill_id} differs from the record sealed in entry {e.seq}: edited after it was recorded"))
        else:
            report.records += 1
    for drill_id, row in sorted(contents.drills.items()):
        if drill_id in latest or drill_id in contents.unreadable or row["status"] == DrillStatus.RUNNING.value:
            continue
        if _before_chain(row, first):
            report.before_chain += 1
            continue
        out.append(_problem("record-unsealed", f"drill #{drill_id}", f"drill #{drill_id} is closed but not in the chain: inserted or closed outside drill"))
    return out


CHAINED_SINCE = (0, 3)
"""The drill version that began sealing records: a newer record outside the chain is suspect."""


def _before_chain(row: Mapping[str, Any], first: AuditEntry | None) -> bool:
    """Closed before drill kept a chain (or before this chain's first entry)."""
    parts = []
    for piece in str(row["drill_version"] or "0").split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit()) or "0"
        parts.append(int(digits))
    if tuple(parts) >= CHAINED_SINCE or first is None:  # no chain at all: wiped, not "before" it
        return False
    finished = row["finished_at"]
    return finished is not None and finished < first.sealed_at and row["id"] < first.drill_id


def chain_head(s: Session) -> ChainHead | None:
    e = s.scalars(select(AuditEntry).order_by(AuditEntry.seq.desc()).limit(1)).first()
    return ChainHead(e.seq, e.hash, e.drill_id, e.sealed_at) if e else None


__all__ = ["GENESIS", "ChainHead", "ChainReport", "chain_head", "load_audit_key", "seal_drill", "verify_chain"]
