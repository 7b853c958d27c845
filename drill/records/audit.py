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
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import func, insert, select, text
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
    return {
        k: (v.astimezone(timezone.utc).isoformat() if isinstance(v, datetime) else v)
        for k, v in row.items()
        if k not in drop
    }


LATER_COLUMNS = ("options",)
"""Columns of ``drills`` added after ``drill-audit/1`` entries were written: their digests never
covered them, so verifying one of those leaves them out."""


def _digest(
    drill: Mapping[str, Any],
    checkpoint_uri: str | None,
    checks: Iterable[Mapping[str, Any]],
    steps: Iterable[Mapping[str, Any]],
    legacy: bool = False,
) -> str:
    doc = {
        "drill": _plain(drill, ("checkpoint_id", *(LATER_COLUMNS if legacy else ()))),
        "checkpoint": checkpoint_uri,
        "checks": [_plain(c, ("id", "drill_id")) for c in checks],
        "replay_steps": [_plain(r, ("id", "drill_id")) for r in steps],
    }
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _message(
    seq: int,
    drill_id: int,
    content: str,
    sealed_at: datetime,
    prev: str,
    closed_by: str | None = None,
    supersedes: int | None = None,
) -> bytes:
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
        self.uris = dict(
            s.execute(
                select(k.c.id, k.c.uri).where(k.c.id.in_({x["checkpoint_id"] for x in self.drills.values()} - {None}))
            ).all()
        )
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
    seq, prev = _chain_end(s, closed_by)
    supersedes = s.scalar(
        select(AuditEntry.seq).where(AuditEntry.drill_id == drill_id).order_by(AuditEntry.seq.desc()).limit(1)
    )
    content = _Contents(s, [drill_id]).digest(drill_id)
    assert content is not None
    entry = AuditEntry(**_entry(seq + 1, prev, drill_id, content, key, closed_by, supersedes))
    s.add(entry)
    s.flush()
    return entry


def seal_drills(s: Session, drill_ids: list[int], key: bytes | None, closed_by: str = "drill") -> int:
    """Append many closed drills, none sealed yet, to the chain in the order given, in one
    pass (records imported in bulk: one read of their contents, one insert)."""
    seq, prev = _chain_end(s, closed_by)
    contents = _Contents(s, drill_ids)
    rows = []
    for drill_id in drill_ids:
        content = contents.digest(drill_id)
        assert content is not None, drill_id
        seq += 1
        rows.append(_entry(seq, prev, drill_id, content, key, closed_by, None))
        prev = rows[-1]["hash"]
    if rows:
        s.execute(insert(AuditEntry), rows)
    return len(rows)


def _chain_end(s: Session, closed_by: str) -> tuple[int, str]:
    """(seq, hash) of the chain's last entry, with appends serialized for this transaction."""
    assert closed_by in CLOSERS, closed_by
    s.flush()
    if s.get_bind().dialect.name == "postgresql":
        s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK})
    # On SQLite the flush above already holds the database's write lock: appends are serial.
    last = s.execute(select(AuditEntry.seq, AuditEntry.hash).order_by(AuditEntry.seq.desc()).limit(1)).first()
    return (last[0], last[1]) if last else (0, GENESIS)


def _entry(
    seq: int, prev: str, drill_id: int, content: str, key: bytes | None, closed_by: str, supersedes: int | None
) -> dict[str, Any]:
    sealed_at = datetime.now(timezone.utc)
    message = _message(seq, drill_id, content, sealed_at, prev, closed_by, supersedes)
    return {
        "seq": seq, "drill_id": drill_id, "content_sha256": content, "prev_hash": prev, "hash": _hash(message),
        "mac": hmac.new(key, message, hashlib.sha256).hexdigest() if key else None, "key_id": key_id(key) if key else None,
        "sealed_at": sealed_at, "closed_by": closed_by, "supersedes": supersedes,
    }  # fmt: skip


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
    verified_from: VerifiedHead | None = None
    """The head an earlier pass verified, when this pass went on from it (incremental)."""

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
            "incremental_from": self.verified_from.to_dict() if self.verified_from else None,
            "problems": [p.to_dict() for p in self.problems],
        }


def _problem(code: str, subject: str, message: str, severity: Severity = Severity.ERROR) -> Finding:
    return Finding(check="audit", code=code, severity=severity, subject=subject, message=message)


BATCH = 2000
"""Entries (and records) verified per read: memory stays bounded whatever the log's length."""


def verify_chain(
    s: Session,
    *,
    key: bytes | None = None,
    head: str | None = None,
    keyed_from: int | None = None,
    since: VerifiedHead | None = None,
) -> ChainReport:
    """Recompute every link, every entry (its HMAC under ``key``, who closed it, what it
    supersedes) and every closed record's digest; name what does not match. With ``key``,
    entries from ``keyed_from`` on (all, by default) must carry that key's HMAC.

    With ``since`` (the head an earlier pass verified, :func:`verified_head`) only what came
    after it is recomputed — the entries after it, the records they seal and the drills
    recorded since — once the verified prefix is shown to be still there, unchanged at its
    end and complete: an incremental pass, as fast for a year of records as for a day. Only a
    full pass (``since=None``) finds an older record edited in place."""
    from sqlalchemy import inspect

    if not inspect(s.connection()).has_table(AuditEntry.__tablename__):
        return ChainReport(
            problems=[
                _problem(
                    "chain-missing",
                    AuditEntry.__tablename__,
                    "the audit_log table is gone: the tamper-evident log was dropped",
                )
            ]
        )
    report = ChainReport(entries=s.scalar(select(func.count()).select_from(AuditEntry)) or 0, verified_from=since)
    start, prev_hash = (since.seq, since.hash) if since else (0, GENESIS)
    if since is not None:
        report.problems += _prefix_problems(s, since)
    first = s.scalars(select(AuditEntry).order_by(AuditEntry.seq).limit(1)).first()
    first_seen = (first.sealed_at, first.drill_id) if first is not None else None
    latest, last = _walk(s, report, start, prev_hash, since is not None, key, keyed_from)
    report.head = last or (_head_of(since) if since is not None else None)
    report.problems += _record_problems(s, latest, first_seen, report, None if since is None else since.drills_through)
    if head is not None:
        report.problems += _pinned_head_problems(s, head)
    return report


def _walk(
    s: Session,
    report: ChainReport,
    start: int,
    prev_hash: str,
    current: bool,
    key: bytes | None,
    keyed_from: int | None,
) -> tuple[dict[int, _Seen], ChainHead | None]:
    """Every entry after ``start`` in order, batch by batch: its link to the one before, its
    HMAC and what it supersedes (problems go to ``report``). Returns each drill's latest entry
    and the last readable one."""
    latest: dict[int, _Seen] = {}
    prev_seq, last = start, None
    for batch in _batches(s, start):
        latest.update(_sealed_before(s, start, {e.drill_id for e in batch} - latest.keys()))
        for e in batch:
            if isinstance(e, _Unreadable):
                report.problems.append(
                    _problem(
                        "entry-edited",
                        f"entry {e.seq}",
                        f"entry {e.seq} (drill #{e.drill_id}) holds a value drill cannot read ({e.why}): the entry was edited",
                    )
                )
            else:
                report.problems += _link_problems(e, prev_hash, prev_seq, key, report, keyed_from)
                report.problems += _reseal_problems(e, latest.get(e.drill_id), current)
                current, last = current or e.closed_by is not None, ChainHead(e.seq, e.hash, e.drill_id, e.sealed_at)
            prev_hash, prev_seq = e.hash, e.seq
            latest[e.drill_id] = _Seen.of(e)
    return latest, last


def _pinned_head_problems(s: Session, head: str) -> list[Finding]:
    """A head pinned elsewhere (``--head``) that the chain no longer holds."""
    if s.scalar(select(func.count()).select_from(AuditEntry).where(AuditEntry.hash == head.strip().lower())):
        return []
    return [
        _problem(
            "head-missing",
            head,
            f"the pinned chain head {head} is not in the chain: the log was rewritten or its newest entries deleted",
        )
    ]


def _head_of(since: VerifiedHead) -> ChainHead:
    return ChainHead(since.seq, since.hash, since.drill_id, since.sealed_at)


@dataclass(frozen=True, slots=True)
class _Seen:
    """What the chain says of a record: its latest entry, in brief."""

    seq: int
    closed_by: str | None
    content_sha256: str
    unreadable: bool = False

    @classmethod
    def of(cls, e: AuditEntry | _Unreadable) -> _Seen:
        return cls(e.seq, e.closed_by, e.content_sha256, isinstance(e, _Unreadable))


def _batches(s: Session, after: int) -> Iterator[list[AuditEntry | _Unreadable]]:
    """The entries after ``after``, in order, :data:`BATCH` at a time."""
    while True:
        batch = _entries(s, after)
        if not batch:
            return
        yield batch
        after = batch[-1].seq
        s.expunge_all()


def _sealed_before(s: Session, start: int, drill_ids: set[int]) -> dict[int, _Seen]:
    """The latest entry up to ``start`` of each of ``drill_ids``: what a later entry for the
    same record must supersede."""
    if not start or not drill_ids:
        return {}
    q = select(AuditEntry.seq, AuditEntry.drill_id, AuditEntry.closed_by, AuditEntry.content_sha256)
    q = q.where(AuditEntry.seq <= start, AuditEntry.drill_id.in_(drill_ids)).order_by(AuditEntry.seq)
    return {drill_id: _Seen(seq, closed_by, content) for seq, drill_id, closed_by, content in s.execute(q)}


def _prefix_problems(s: Session, since: VerifiedHead) -> list[Finding]:
    """The prefix an earlier pass verified is still whole: its last entry is the one verified
    (same hash) and none of the entries before it is gone."""
    when = f"{since.verified_at:%Y-%m-%d %H:%M}Z"
    hash_ = s.scalar(select(AuditEntry.hash).where(AuditEntry.seq == since.seq))
    if hash_ != since.hash:
        what = "is gone" if hash_ is None else "was replaced"
        return [
            _problem(
                "verified-head-missing",
                f"entry {since.seq}",
                f"entry {since.seq}, verified on {when}, {what}: the log was rewritten since (drill audit verify --full)",
            )
        ]
    kept = s.scalar(select(func.count()).select_from(AuditEntry).where(AuditEntry.seq <= since.seq)) or 0
    if kept != since.seq:
        return [
            _problem(
                "entries-missing",
                f"entries 1..{since.seq}",
                f"{since.seq - kept} of the entries verified on {when} are gone: deleted (drill audit verify --full)",
            )
        ]
    return []


@dataclass(frozen=True, slots=True)
class _Unreadable:
    """A chain entry with a value that cannot be read back: what is left of it to follow the chain."""

    seq: int
    drill_id: int
    hash: str
    content_sha256: str
    why: str
    closed_by: str | None = None


def _entries(s: Session, after: int = 0) -> list[AuditEntry | _Unreadable]:
    """Up to :data:`BATCH` entries after ``after``, in order; an entry whose values cannot
    all be read (edited outside drill) stands in with its plain columns, so the entries after
    it are still checked."""
    where = AuditEntry.seq > after
    try:
        return list(s.scalars(select(AuditEntry).where(where).order_by(AuditEntry.seq).limit(BATCH)))
    except (ValueError, TypeError):
        pass
    out: list[AuditEntry | _Unreadable] = []
    plain = select(
        AuditEntry.seq, AuditEntry.drill_id, AuditEntry.hash, AuditEntry.content_sha256, AuditEntry.closed_by
    ).where(where)
    for seq, drill_id, hash_, content, closed_by in s.execute(plain.order_by(AuditEntry.seq).limit(BATCH)):
        try:
            out.append(s.scalars(select(AuditEntry).where(AuditEntry.seq == seq)).one())
        except (ValueError, TypeError) as exc:
            out.append(_Unreadable(seq, drill_id, hash_, content, one_line(exc), closed_by))
    return out


def _link_problems(
    e: AuditEntry, prev_hash: str, prev_seq: int, key: bytes | None, report: ChainReport, keyed_from: int | None
) -> list[Finding]:
    out = []
    where = f"entry {e.seq} (drill #{e.drill_id})"
    if e.seq != prev_seq + 1:
        out.append(
            _problem(
                "entries-missing",
                f"entry {e.seq}",
                f"entries {prev_seq + 1}..{e.seq - 1} are missing from the chain: deleted",
            )
        )
    message = _entry_message(e)
    if e.prev_hash != prev_hash and e.seq == prev_seq + 1:
        out.append(
            _problem(
                "link-broken",
                where,
                f"{where} does not follow the entry before it: entries were reordered, edited or replaced",
            )
        )
    if _hash(message) != e.hash:
        out.append(_problem("entry-edited", where, f"{where} does not match its own hash: the entry was edited"))
    if key is not None:
        out += _mac_problems(e, message, key, report, keyed_from)
    return out


def _mac_problems(
    e: AuditEntry, message: bytes, key: bytes, report: ChainReport, keyed_from: int | None
) -> list[Finding]:
    """Under a key every entry must be that key's: a missing or foreign HMAC is how a forger
    without the key would downgrade the chain, so it fails — unless the entry predates the
    key (``keyed_from``, named by the operator who introduced it)."""
    where = f"entry {e.seq} (drill #{e.drill_id})"
    mine = e.mac is not None and e.key_id == key_id(key)
    if mine and e.mac is not None and hmac.compare_digest(e.mac, hmac.new(key, message, hashlib.sha256).hexdigest()):
        report.authenticated += 1
        return []
    if mine:
        return [
            _problem(
                "entry-forged", where, f"{where} fails its HMAC: written or rewritten by someone without the audit key"
            )
        ]
    if keyed_from is not None and e.seq < keyed_from:
        report.unkeyed_before += 1
        return []
    if e.mac is None:
        return [
            _problem(
                "entry-unauthenticated",
                where,
                f"{where} carries no HMAC although an audit key is configured: sealed without the key, or stripped of it",
            )
        ]
    return [
        _problem(
            "entry-other-key",
            where,
            f"{where} claims another audit key (key id {e.key_id}): not authenticated by this one",
        )
    ]


def _reseal_problems(e: AuditEntry, before: _Seen | None, current: bool) -> list[Finding]:
    """A second entry for a record is legitimate only where the first was a guess (orphan
    recovery) and the entry says it supersedes it."""
    where = f"entry {e.seq} (drill #{e.drill_id})"
    if e.closed_by is None:
        return (
            [
                _problem(
                    "entry-downgraded",
                    where,
                    f"{where} is written in the old format after newer entries: forged to dodge the reseal check",
                )
            ]
            if current
            else []
        )
    if e.closed_by not in CLOSERS:
        return [_problem("entry-edited", where, f"{where} was closed by {e.closed_by!r}, which drill never writes")]
    if before is None:
        if e.supersedes is not None:
            return [
                _problem(
                    "link-broken",
                    where,
                    f"{where} claims to supersede entry {e.supersedes}, which is not this record's",
                )
            ]
        return []
    if before.unreadable:
        return []  # the entry before it is already named as edited
    if e.supersedes != before.seq or before.closed_by != PROVISIONAL:
        how = f"closed by {before.closed_by or 'a drill before 0.5'} in entry {before.seq}"
        return [
            _problem(
                "record-resealed",
                f"drill #{e.drill_id}",
                f"drill #{e.drill_id} was {how} and sealed again in entry {e.seq}: a record rewritten, then resealed to hide it",
            )
        ]
    return []


def _record_problems(
    s: Session,
    latest: dict[int, _Seen],
    first: tuple[datetime, int] | None,
    report: ChainReport,
    drills_through: int | None,
) -> list[Finding]:
    """Each record the pass saw sealed, against its latest entry, :data:`BATCH` records at a
    time; then the closed records the chain does not hold (every one on a full pass, those
    recorded after ``drills_through`` on an incremental one)."""
    out: list[Finding] = []
    ids = sorted(latest)
    for i in range(0, len(ids), BATCH):
        contents = _Contents(s, ids[i : i + BATCH])
        out += [
            p for drill_id in ids[i : i + BATCH] for p in _record_problem(contents, drill_id, latest[drill_id], report)
        ]
    d = Drill.__table__
    closed = select(d.c.id).where(d.c.id > (drills_through or 0), d.c.status != DrillStatus.RUNNING.value)
    unsealed = [
        i
        for i in s.execute(closed.where(d.c.id.not_in(select(AuditEntry.drill_id))).order_by(d.c.id)).scalars()
        if i not in latest
    ]
    for i in range(0, len(unsealed), BATCH):
        contents = _Contents(s, unsealed[i : i + BATCH])
        for drill_id, row in sorted(contents.drills.items()):
            if drill_id in contents.unreadable:
                continue
            if _before_chain(row, first):
                report.before_chain += 1
                continue
            out.append(
                _problem(
                    "record-unsealed",
                    f"drill #{drill_id}",
                    f"drill #{drill_id} is closed but not in the chain: inserted or closed outside drill",
                )
            )
    return out


def _record_problem(contents: _Contents, drill_id: int, e: _Seen, report: ChainReport) -> list[Finding]:
    if drill_id in contents.unreadable:
        why = contents.unreadable[drill_id]
        return [
            _problem(
                "record-edited",
                f"drill #{drill_id}",
                f"drill #{drill_id} holds a value drill cannot read ({why}): edited after it was recorded",
            )
        ]
    digest = contents.digest(drill_id, legacy=e.closed_by is None)
    if digest is None:
        return [
            _problem(
                "record-deleted",
                f"drill #{drill_id}",
                f"drill #{drill_id} is in the chain (entry {e.seq}) but its record is gone: deleted",
            )
        ]
    if digest != e.content_sha256:
        return [
            _problem(
                "record-edited",
                f"drill #{drill_id}",
                f"drill #{drill_id} differs from the record sealed in entry {e.seq}: edited after it was recorded",
            )
        ]
    report.records += 1
    return []


CHAINED_SINCE = (0, 3)
"""The drill version that began sealing records: a newer record outside the chain is suspect."""


def _before_chain(row: Mapping[str, Any], first: tuple[datetime, int] | None) -> bool:
    """Closed before drill kept a chain (or before this chain's first entry)."""
    parts = []
    for piece in str(row["drill_version"] or "0").split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit()) or "0"
        parts.append(int(digits))
    if tuple(parts) >= CHAINED_SINCE or first is None:  # no chain at all: wiped, not "before" it
        return False
    finished = row["finished_at"]
    return finished is not None and finished < first[0] and row["id"] < first[1]


# -- the verified head ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class VerifiedHead:
    """How far an intact pass verified the chain, and when: where the next pass starts."""

    seq: int
    hash: str
    drill_id: int
    sealed_at: datetime
    drills_through: int
    """The newest drill id recorded when it was verified."""
    verified_at: datetime
    full: bool

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "hash": self.hash, "verified_at": self.verified_at.isoformat(), "full": self.full}

    def message(self) -> bytes:
        return "|".join(
            ["drill-audit-verified/1", str(self.seq), self.hash, str(self.drills_through), self.verified_at.isoformat()]
        ).encode()


def verified_head(s: Session, key: bytes | None) -> VerifiedHead | None:
    """The newest head an intact pass recorded (:func:`remember_head`); with ``key``, only one
    that carries that key's HMAC — a head written without the key is not a place to start from."""
    from sqlalchemy import inspect

    from drill.records.models import AuditVerified

    if not inspect(s.connection()).has_table(AuditVerified.__tablename__):
        return None
    row = s.scalars(select(AuditVerified).order_by(AuditVerified.id.desc()).limit(1)).first()
    if row is None:
        return None
    head = VerifiedHead(
        row.seq, row.hash, row.drill_id, _utc(row.sealed_at), row.drills_through, _utc(row.verified_at), row.full
    )
    if key is not None:
        good = row.mac is not None and hmac.compare_digest(
            row.mac, hmac.new(key, head.message(), hashlib.sha256).hexdigest()
        )
        if not good:
            return None
    return head


def remember_head(s: Session, report: ChainReport, key: bytes | None, *, full: bool) -> VerifiedHead | None:
    """Record how far an intact pass verified the chain (nothing for one with problems)."""
    from drill.records.models import AuditVerified

    if not report.intact or report.head is None:
        return None
    h = report.head
    through = s.scalar(select(func.max(Drill.id))) or 0
    head = VerifiedHead(h.seq, h.hash, h.drill_id, h.sealed_at, through, datetime.now(timezone.utc), full)
    mac = hmac.new(key, head.message(), hashlib.sha256).hexdigest() if key else None
    s.add(
        AuditVerified(
            seq=h.seq,
            hash=h.hash,
            drill_id=h.drill_id,
            sealed_at=h.sealed_at,
            drills_through=through,
            verified_at=head.verified_at,
            full=full,
            mac=mac,
        )
    )
    return head


def _utc(t: datetime) -> datetime:
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t


def chain_head(s: Session) -> ChainHead | None:
    e = s.scalars(select(AuditEntry).order_by(AuditEntry.seq.desc()).limit(1)).first()
    return ChainHead(e.seq, e.hash, e.drill_id, e.sealed_at) if e else None


__all__ = [
    "GENESIS",
    "ChainHead",
    "ChainReport",
    "VerifiedHead",
    "chain_head",
    "load_audit_key",
    "remember_head",
    "seal_drill",
    "seal_drills",
    "verified_head",
    "verify_chain",
]
