"""The tamper-evident drill log: every closed drill record sealed into a hash chain.

When a drill's record is closed — by the drill itself, by the parent that saw it die, by
orphan recovery, or by a spooled verdict delivered later — its content (the drill row, its
checks with their evidence, its replayed steps and the checkpoint's URI, read as the database
stores them: :mod:`drill.records.content`) is digested with SHA-256 and appended to
``audit_log`` in the same transaction, as entry ``seq``::

    hash[seq] = SHA-256("drill-audit/3" | seq | drill id | content digest | sealed at | hash[seq-1]
                        | closed by | the seq this entry supersedes)

With an audit key (``$DRILL_AUDIT_KEY_FILE`` or ``$DRILL_AUDIT_KEY``) each entry also carries
an HMAC-SHA256 of the same message. :func:`verify_chain` recomputes every link and every
record's digest — the whole log, every time: a year of records is a few seconds — and names an
edited record, an edited, reordered or deleted entry, a deleted drill row, or a closed record
outside the chain (whatever drill version it claims). :func:`attest` checks the records a
command is about to show or rely on against their entries, as they are read.

A record is sealed once. The one exception is a guess: orphan recovery closes a drill whose
process is gone as ``aborted``, and the truth may arrive later (the spooled verdict, or the
parent that saw the process die); that entry names the one it supersedes. Any other second
entry for a record is ``record-resealed``: a record edited, then sealed again to hide it.
Entries drill 0.5 and earlier wrote (``drill-audit/1`` and ``/2``, digested as canonical
JSON: :mod:`drill.records.legacy`) are verified as they were written; one of those after a
newer entry is a forgery (``entry-downgraded``).

Fail closed: with an audit key, an entry without its HMAC or with another key's is an error
(before ``keyed_from``, the entry an operator named when the key was introduced, it is
counted, not failed); closed records with no chain at all, or no chain table, are errors.
Deleting the newest records together with their entries leaves a shorter chain that is still
consistent — which is why reports print the chain head: an auditor who pinned it (``drill
audit verify --head HASH``) sees it vanish. Without a key, someone with write access to the
database could recompute the whole chain; the pinned head or a key they do not hold is what
stops that.

Alerts and the coverage ledger are not sealed: they are written after the record closes.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import func, insert, select, text
from sqlalchemy.orm import Session

from drill.claims import RecordSeal
from drill.errors import one_line
from drill.findings import Finding, Severity
from drill.records import content
from drill.records.models import AuditEntry, AuditVerified, Drill
from drill.verdict import DrillStatus

GENESIS = "0" * 64
VERSION = 3
"""The entry format drill writes: ``drill-audit/3``, its record digested by :mod:`drill.records.content`."""
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


# -- entries --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Entry:
    """One entry of the log, as stored (read without the ORM: a value that is not what drill
    writes is ``unreadable``, and the entries after it are still checked)."""

    seq: int
    drill_id: int
    content_sha256: str
    prev_hash: str
    hash: str
    mac: str | None
    key_id: str | None
    sealed_at: str | None
    """When it was sealed, as its message writes it: ISO 8601 in UTC."""
    closed_by: str | None
    supersedes: int | None
    version: int | None
    unreadable: str | None = None

    @property
    def format(self) -> int:
        """1, 2 or 3: ``drill-audit/N``."""
        if self.version is not None:
            return self.version
        return 1 if self.closed_by is None else 2

    def message(self) -> bytes:
        assert self.sealed_at is not None
        return _message(
            self.seq, self.drill_id, self.content_sha256, self.sealed_at, self.prev_hash,
            self.closed_by, self.supersedes, self.format,
        )  # fmt: skip

    def where(self) -> str:
        return f"entry {self.seq} (drill #{self.drill_id})"


Seen = tuple[int, str, str]
"""What the walk keeps of an entry read on its fast path (in order, linked, its own hash, the
first of its record, the current format): its seq, its record's digest, who closed it — not
the entry (200,000 entries are 120 MB as objects, 50 as these)."""


def _as_entry(drill_id: int, seen: Entry | Seen) -> Entry:
    """An entry the walk kept, as an :class:`Entry` (the fields the checks after the walk ask)."""
    if isinstance(seen, Entry):
        return seen
    seq, digest, closed_by = seen
    return Entry(seq, drill_id, digest, "", "", None, None, None, closed_by, None, VERSION)


_COLUMNS = "seq, drill_id, content_sha256, prev_hash, hash, mac, key_id, sealed_at, closed_by, supersedes, version"


def _entry(row: Any) -> Entry:
    seq, drill_id, content_sha256, prev_hash, hash_, mac, key, sealed_at, closed_by, supersedes, version = row
    try:
        if (
            type(seq) is not int
            or type(drill_id) is not int
            or type(content_sha256) is not str
            or type(prev_hash) is not str
            or type(hash_) is not str
            or (supersedes is not None and type(supersedes) is not int)
            or (version is not None and type(version) is not int)
        ):
            raise ValueError("a column of the wrong type")
        return Entry(
            seq, drill_id, content_sha256, prev_hash, hash_, mac, key, _iso(sealed_at), closed_by, supersedes, version
        )
    except (ValueError, TypeError) as exc:
        return Entry(
            seq if type(seq) is int else -1, drill_id if type(drill_id) is int else -1, str(content_sha256),
            str(prev_hash), str(hash_), None, None, None, None, None, None, one_line(exc),
        )  # fmt: skip


def _iso(value: Any) -> str:
    """A time as the database stored it, as an entry's message writes it: ISO 8601 in UTC (what
    ``datetime.isoformat`` gives). SQLite's text as drill stores it (``2026-12-07 16:10:38.123456``,
    UTC) is rewritten without parsing: a log of 200,000 entries reads 200,000 of them."""
    if isinstance(value, str) and len(value) == 26 and value[10] == " " and value[19] == ".":
        if value[20:] == "000000":
            return f"{value[:10]}T{value[11:19]}+00:00"
        return f"{value[:10]}T{value[11:]}+00:00"
    return _time(value).isoformat()


def _time(value: Any) -> datetime:
    """A time as the database stored it (SQLite: naive UTC text; PostgreSQL: aware), in UTC."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if not isinstance(value, datetime):
        raise ValueError(f"{value!r} is not a time")
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def _entries(s: Session, where: str = "", params: dict[str, Any] | None = None) -> list[Entry]:
    return [
        _entry(row) for row in s.execute(text(f"SELECT {_COLUMNS} FROM audit_log {where} ORDER BY seq"), params or {})
    ]


BATCH = 5000
"""Entries read per query: memory stays bounded whatever the log's length."""


def _all_rows(s: Session) -> Iterator[Any]:
    """Every entry's row in order of seq, read :data:`BATCH` at a time through the driver's
    own cursor (an entry whose seq is not a number still comes, last)."""
    cursor = s.connection().connection.cursor()
    try:
        cursor.execute(f"SELECT {_COLUMNS} FROM audit_log ORDER BY seq")
        while rows := cursor.fetchmany(BATCH):
            yield from rows
    finally:
        cursor.close()


def _message(
    seq: int,
    drill_id: int,
    content_sha256: str,
    sealed_at: str,
    prev: str,
    closed_by: str | None,
    supersedes: int | None,
    version: int,
) -> bytes:
    head = f"{seq}|{drill_id}|{content_sha256}|{sealed_at}|{prev}"
    if version == 1:
        return f"drill-audit/1|{head}".encode()
    return f"drill-audit/{version}|{head}|{closed_by}|{supersedes if supersedes is not None else '-'}".encode()


def _hash(message: bytes) -> str:
    return hashlib.sha256(message).hexdigest()


# -- content --------------------------------------------------------------------------------
def record_digests(s: Session, drill_ids: Collection[int], refs: dict[int, list[str]] | None = None) -> dict[int, str]:
    """Drill id → its record's ``drill-audit/3`` content digest (:mod:`drill.records.content`),
    read in this session's transaction: what sealing writes and verifying recomputes (with
    ``refs``: each record's evidence documents, added to it)."""
    out: dict[int, str] = {}
    ids = sorted(drill_ids)
    s.flush()
    cursor = s.connection().connection.cursor()
    try:
        for i in range(0, len(ids), content.BATCH):
            out.update(content.digests(cursor, s.get_bind().dialect.name, ids[i : i + content.BATCH], refs))
    finally:
        cursor.close()
    return out


def broken_documents(s: Session, digests: Collection[str]) -> dict[str, str]:
    """Of these evidence documents, the ones missing or not matching their name (the SHA-256 of
    their body), and how."""
    from drill.records.models import Document

    wanted = sorted(set(digests))
    found: dict[str, str] = {}
    for i in range(0, len(wanted), 500):
        query = select(Document.digest, Document.body).where(Document.digest.in_(wanted[i : i + 500]))
        for digest, body in s.execute(query):
            found[digest] = body
    out = {}
    for digest in wanted:
        held = found.get(digest)
        if held is None:
            out[digest] = "missing: deleted"
        elif hashlib.sha256(held.encode()).hexdigest() != digest:
            out[digest] = "does not match its name: edited"
    return out


def _document_problems(s: Session, refs: Collection[str]) -> list[Finding]:
    return [
        _problem(
            "record-edited",
            f"evidence document {digest}",
            f"evidence document {digest}, which records name, is {how} after it was recorded",
        )
        for digest, how in sorted(broken_documents(s, refs).items())
    ]


def _legacy_digests(s: Session, entries: dict[int, Entry]) -> dict[int, str]:
    """The records whose entries drill 0.5 and earlier wrote, digested as those entries did."""
    from drill.records.legacy import Contents

    out: dict[int, str] = {}
    ids = sorted(entries)
    for i in range(0, len(ids), content.BATCH):
        contents = Contents(s, ids[i : i + content.BATCH])
        for drill_id in ids[i : i + content.BATCH]:
            if drill_id in contents.unreadable:
                out[drill_id] = content.UNREADABLE
            else:
                got = contents.digest(drill_id, legacy=entries[drill_id].format == 1)
                if got is not None:
                    out[drill_id] = got
    return out


# -- sealing --------------------------------------------------------------------------------
def seal_drill(s: Session, drill_id: int, key: bytes | None, closed_by: str = "drill") -> None:
    """Append the closed drill ``drill_id`` to the chain, in the caller's transaction;
    ``closed_by`` says who closed it (one of :data:`CLOSERS`)."""
    seq, prev = _chain_end(s, closed_by)
    supersedes = s.scalar(
        select(AuditEntry.seq).where(AuditEntry.drill_id == drill_id).order_by(AuditEntry.seq.desc()).limit(1)
    )
    digest = record_digests(s, [drill_id]).get(drill_id)
    if digest is None or digest == content.UNREADABLE:
        raise ValueError(f"drill #{drill_id} cannot be sealed: its record is not as drill writes it")
    s.execute(insert(AuditEntry), [_new_entry(seq + 1, prev, drill_id, digest, key, closed_by, supersedes)])


def seal_drills(s: Session, drill_ids: list[int], key: bytes | None, closed_by: str = "drill") -> int:
    """Append many closed drills, none sealed yet, to the chain in the order given, in one
    pass (records imported in bulk: one read of their contents, one insert per batch)."""
    seq, prev = _chain_end(s, closed_by)
    digests = record_digests(s, drill_ids)
    rows = []
    for drill_id in drill_ids:
        seq += 1
        rows.append(_new_entry(seq, prev, drill_id, digests[drill_id], key, closed_by, None))
        prev = rows[-1]["hash"]
        if len(rows) == BATCH:
            s.execute(insert(AuditEntry), rows)
            rows = []
    if rows:
        s.execute(insert(AuditEntry), rows)
    return len(drill_ids)


def _chain_end(s: Session, closed_by: str) -> tuple[int, str]:
    """(seq, hash) of the chain's last entry, with appends serialized for this transaction."""
    assert closed_by in CLOSERS, closed_by
    s.flush()
    if s.get_bind().dialect.name == "postgresql":
        s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK})
    # On SQLite the flush above already holds the database's write lock: appends are serial.
    last = s.execute(select(AuditEntry.seq, AuditEntry.hash).order_by(AuditEntry.seq.desc()).limit(1)).first()
    return (last[0], last[1]) if last else (0, GENESIS)


def _new_entry(
    seq: int, prev: str, drill_id: int, digest: str, key: bytes | None, closed_by: str, supersedes: int | None
) -> dict[str, Any]:
    sealed_at = datetime.now(timezone.utc)
    message = _message(seq, drill_id, digest, sealed_at.isoformat(), prev, closed_by, supersedes, VERSION)
    return {
        "seq": seq, "drill_id": drill_id, "content_sha256": digest, "prev_hash": prev, "hash": _hash(message),
        "mac": hmac.new(key, message, hashlib.sha256).hexdigest() if key else None, "key_id": key_id(key) if key else None,
        "sealed_at": sealed_at, "closed_by": closed_by, "supersedes": supersedes, "version": VERSION,
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
    """Records that match their latest entry."""
    head: ChainHead | None = None
    authenticated: int = 0
    """Entries whose HMAC verified under the key given."""
    unkeyed_before: int = 0
    """Entries before ``keyed_from`` that carry no HMAC of the key (sealed before it was introduced)."""
    problems: list[Finding] = field(default_factory=list)
    scope: str = "every record"
    """Which records' contents were recomputed: ``every record``, or the records a report covers."""
    last_full: dict[str, Any] | None = None
    """The last full pass recorded (``drill audit verify``), when this one was not full."""

    @property
    def intact(self) -> bool:
        return not any(p.severity is Severity.ERROR for p in self.problems)

    def to_dict(self) -> dict[str, Any]:
        return {
            "intact": self.intact,
            "entries": self.entries,
            "records": self.records,
            "scope": self.scope,
            "authenticated": self.authenticated,
            "unkeyed_before": self.unkeyed_before,
            "head": self.head.to_dict() if self.head else None,
            "last_full": self.last_full,
            "problems": [p.to_dict() for p in self.problems],
        }


def _problem(code: str, subject: str, message: str, severity: Severity = Severity.ERROR) -> Finding:
    return Finding(check="audit", code=code, severity=severity, subject=subject, message=message)


def verify_chain(
    s: Session,
    *,
    key: bytes | None = None,
    head: str | None = None,
    keyed_from: int | None = None,
    records: Collection[int] | None = None,
    workers: int | None = None,
) -> ChainReport:
    """Recompute every link and every entry (its hash, its HMAC under ``key``, who closed it,
    what it supersedes), and every closed record's digest (of ``records`` only, when given:
    the drills a report covers); name what does not match. With ``key``, entries from
    ``keyed_from`` on (all, by default) must carry that key's HMAC. ``workers`` processes
    recompute the digests (default: the cores this process may use)."""
    from sqlalchemy import inspect

    if not inspect(s.connection()).has_table(AuditEntry.__tablename__):
        return ChainReport(
            problems=[
                _problem(
                    "chain-missing", "audit_log", "the audit_log table is gone: the tamper-evident log was dropped"
                )
            ]
        )
    report = ChainReport(scope="every record" if records is None else f"the {len(records)} record(s) reported")
    digests = _Digests(s, records, workers)  # recomputed by workers while the log is walked here
    try:
        latest = _walk(s, report, key, keyed_from)
        report.entries = s.scalar(select(func.count()).select_from(AuditEntry)) or 0
        report.problems += _unsealed(s, latest, records)
        wanted = latest if records is None else {i: latest[i] for i in records if i in latest}
        report.problems += _record_problems(s, wanted, report, digests)
    finally:
        digests.close()
    if head is not None:
        report.problems += _pinned_head_problems(s, head)
    return report


def _walk(s: Session, report: ChainReport, key: bytes | None, keyed_from: int | None) -> dict[int, Entry | Seen]:
    """Every entry in order: its link to the one before, its hash, its HMAC and what it
    supersedes (problems go to ``report``, the last readable entry is its head). Returns each
    drill's latest entry. The common entry — in order, linked, its own hash, the first for its
    record, written as drill writes it — costs one hash and no more; anything else is looked
    at closely (:func:`_examined`)."""
    latest: dict[int, Entry | Seen] = {}
    state: dict[str, Any] = {"prev_hash": GENESIS, "prev_seq": 0, "newest": 0}
    head: Entry | None = None
    last: tuple[Any, ...] | None = None
    sha256, current = hashlib.sha256, VERSION
    for row in _all_rows(s):
        seq, drill_id, digest, prev, hash_, mac, kid, sealed, closed, supersedes, version = row
        if (
            version == current == state["newest"]
            and key is None
            and supersedes is None
            and type(seq) is int
            and seq == state["prev_seq"] + 1
            and prev == state["prev_hash"]
            and type(drill_id) is int
            and drill_id not in latest
            and type(digest) is str
            and closed in CLOSERS
            and type(sealed) is str
            and len(sealed) == 26
        ):
            iso = _iso(sealed)
            if sha256(_message(seq, drill_id, digest, iso, prev, closed, None, current)).hexdigest() == hash_:
                latest[drill_id] = (seq, digest, closed)
                last, head = row, None
                state["prev_hash"], state["prev_seq"] = hash_, seq
                continue
        e = _entry(row)
        if _examined(e, latest, state, report, key, keyed_from):
            head, last = e, None
    if head is None and last is not None:
        head = _entry(last)
    if head is not None:
        report.head = ChainHead(head.seq, head.hash, head.drill_id, _time(head.sealed_at))
    return latest


def _examined(
    e: Entry,
    latest: dict[int, Entry | Seen],
    state: dict[str, Any],
    report: ChainReport,
    key: bytes | None,
    keyed_from: int | None,
) -> bool:
    """One entry checked in full (problems go to ``report``); whether it is readable."""
    readable = e.unreadable is None
    if not readable:
        report.problems.append(
            _problem(
                "entry-edited",
                f"entry {e.seq}",
                f"{e.where()} holds a value drill cannot read ({e.unreadable}): the entry was edited",
            )
        )
    else:
        report.problems += _link_problems(e, state["prev_hash"], state["prev_seq"], key, report, keyed_from)
        before = latest.get(e.drill_id)
        report.problems += _reseal_problems(
            e, None if before is None else _as_entry(e.drill_id, before), state["newest"]
        )
        state["newest"] = max(state["newest"], e.format)
    state["prev_hash"], state["prev_seq"] = e.hash, e.seq
    latest[e.drill_id] = e
    return readable


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


def _link_problems(
    e: Entry, prev_hash: str, prev_seq: int, key: bytes | None, report: ChainReport, keyed_from: int | None
) -> list[Finding]:
    out = []
    if e.seq != prev_seq + 1:
        what = f"entries {prev_seq + 1}..{e.seq - 1} are missing from the chain: deleted" if e.seq > prev_seq + 1 else (
            f"entry {e.seq} is out of order (after entry {prev_seq}): inserted outside drill"
        )  # fmt: skip
        out.append(_problem("entries-missing" if e.seq > prev_seq else "link-broken", f"entry {e.seq}", what))
    if e.prev_hash != prev_hash and e.seq == prev_seq + 1:
        out.append(
            _problem(
                "link-broken",
                e.where(),
                f"{e.where()} does not follow the entry before it: entries were reordered, edited or replaced",
            )
        )
    message = e.message()
    if _hash(message) != e.hash:
        out.append(
            _problem("entry-edited", e.where(), f"{e.where()} does not match its own hash: the entry was edited")
        )
    if key is not None:
        out += _mac_problems(e, message, key, report, keyed_from)
    return out


def _mac_problems(
    e: Entry, message: bytes, key: bytes, report: ChainReport | None, keyed_from: int | None
) -> list[Finding]:
    """Under a key every entry must be that key's: a missing or foreign HMAC is how a forger
    without the key would downgrade the chain, so it fails — unless the entry predates the
    key (``keyed_from``, named by the operator who introduced it)."""
    where = e.where()
    mine = e.mac is not None and e.key_id == key_id(key)
    if mine and e.mac is not None and hmac.compare_digest(e.mac, hmac.new(key, message, hashlib.sha256).hexdigest()):
        if report is not None:
            report.authenticated += 1
        return []
    if mine:
        return [
            _problem(
                "entry-forged", where, f"{where} fails its HMAC: written or rewritten by someone without the audit key"
            )
        ]
    if keyed_from is not None and e.seq < keyed_from:
        if report is not None:
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


def _reseal_problems(e: Entry, before: Entry | None, newest: int) -> list[Finding]:
    """An entry in an older format than one before it is a forgery; a second entry for a
    record is legitimate only where the first was a guess (orphan recovery) and the entry
    says it supersedes it."""
    where = e.where()
    if e.format < newest:
        return [
            _problem(
                "entry-downgraded",
                where,
                f"{where} is written in an older format (drill-audit/{e.format}) after newer entries: forged to dodge the checks of the newer one",
            )
        ]
    if e.format > 1 and e.closed_by not in CLOSERS:
        return [_problem("entry-edited", where, f"{where} was closed by {e.closed_by!r}, which drill never writes")]
    if e.format > VERSION:
        return [
            _problem(
                "entry-edited", where, f"{where} claims format drill-audit/{e.format}, which this drill never wrote"
            )
        ]
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
    if before.unreadable is not None:
        return []  # the entry before it is already named as edited
    if e.format == 1 or e.supersedes != before.seq or before.closed_by != PROVISIONAL:
        how = f"closed by {before.closed_by or 'a drill before 0.5'} in entry {before.seq}"
        return [
            _problem(
                "record-resealed",
                f"drill #{e.drill_id}",
                f"drill #{e.drill_id} was {how} and sealed again in entry {e.seq}: a record rewritten, then resealed to hide it",
            )
        ]
    return []


def _unsealed(s: Session, latest: dict[int, Entry | Seen], records: Collection[int] | None) -> list[Finding]:
    """Closed records the chain does not hold: inserted or closed outside drill — whatever
    drill version the row claims, whatever its id."""
    d = Drill.__table__
    q = select(d.c.id).where(d.c.status != DrillStatus.RUNNING.value)
    if records is not None:
        q = q.where(d.c.id.in_(list(records)))
    closed = set(s.execute(q).scalars())
    return [
        _problem(
            "record-unsealed",
            f"drill #{drill_id}",
            f"drill #{drill_id} is closed but not in the chain: inserted or closed outside drill",
        )
        for drill_id in sorted(closed - latest.keys())
    ]


def _record_problems(
    s: Session, latest: dict[int, Entry | Seen], report: ChainReport, digests: _Digests
) -> list[Finding]:
    """Each record against its latest entry (the ones that are themselves readable)."""
    current: dict[int, str] = {}
    older: dict[int, Entry] = {}
    for i, seen in latest.items():
        if not isinstance(seen, Entry):
            current[i] = seen[1]
        elif seen.unreadable is None and seen.format == VERSION:
            current[i] = seen.content_sha256
        elif seen.unreadable is None:
            older[i] = seen
    mismatched = digests.mismatches(s, current)
    mismatched.update(_legacy_mismatches(s, older))
    out = []
    for drill_id in sorted(mismatched):
        still = _recheck(s, drill_id, _as_entry(drill_id, latest[drill_id]))  # superseded while the pass ran: no edit
        if still is not None:
            out.append(_record_finding(drill_id, *still))
    report.records = len(current) + len(older) - len(out)
    return out + _document_problems(s, digests.refs)


def _legacy_mismatches(s: Session, entries: dict[int, Entry]) -> dict[int, str | None]:
    got = _legacy_digests(s, entries)
    return {i: got.get(i) for i, e in entries.items() if got.get(i) != e.content_sha256}


PARALLEL_FROM = 4000
"""Records from which a pass recomputes their digests in several processes."""

_FORKED: dict[str, Any] = {}
"""What a forked worker of :class:`_Digests` inherits: the engine."""


class _Digests:
    """The records' digests, recomputed — for many records, by forked workers (each with its
    own connection, each a share of the batches) started before the log is walked, so the two
    run at once; for a few, or where this process cannot fork, here, when asked."""

    def __init__(self, s: Session, records: Collection[int] | None, workers: int | None) -> None:
        import multiprocessing
        import os

        self.refs: set[str] = set()
        self.pool: Any = None
        n = workers or min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 8)
        if records is not None:
            ids = sorted(records)
            chunks: list[Sequence[int]] = [ids[i : i + content.BATCH] for i in range(0, len(ids), content.BATCH)]
        else:  # every drill: ranges of ids (a range holds whichever drills exist in it)
            low, high = s.execute(select(func.min(Drill.id), func.max(Drill.id))).one()
            span = range(low or 0, (high or -1) + 1)
            chunks = [span[i : i + content.BATCH] for i in range(0, len(span), content.BATCH)]
        if (
            len(chunks) * content.BATCH < PARALLEL_FROM
            or n <= 1
            or "fork" not in multiprocessing.get_all_start_methods()
        ):
            return
        _FORKED["engine"] = s.get_bind()
        self.pool = multiprocessing.get_context("fork").Pool(n)
        self.pending = self.pool.imap_unordered(_worker, chunks)

    def mismatches(self, s: Session, entries: dict[int, str]) -> dict[int, str | None]:
        """Drill id → what its record digests to now (None: no record), for those of ``entries``
        (drill id → the digest its entry sealed) that differ from it."""
        if self.pool is None:
            named: dict[int, list[str]] = {}
            got = record_digests(s, entries, named)
            self.refs.update(r for refs in named.values() for r in refs)
        else:
            got = {}
            for part, refs in self.pending:
                got.update(part)
                self.refs.update(refs)
            self.pool.close()
            self.pool.join()
        return {i: got.get(i) for i, sealed in entries.items() if got.get(i) != sealed}

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
        _FORKED.clear()


def _worker(ids: Sequence[int]) -> tuple[dict[int, str], set[str]]:
    engine = _FORKED["engine"]
    connection = _FORKED.get("connection")
    if connection is None:
        from multiprocessing.util import Finalize

        engine.dispose(close=False)  # the parent's connections are the parent's
        connection = _FORKED["connection"] = engine.raw_connection()
        Finalize(None, connection.close, exitpriority=10)  # closed as the worker leaves
    cursor = connection.cursor()
    named: dict[int, list[str]] = {}
    try:
        got = content.digests(cursor, engine.dialect.name, ids, named)
        connection.rollback()  # end the read: a long pass holds no snapshot open
    finally:
        cursor.close()
    return got, {r for refs in named.values() for r in refs}


def _recheck(s: Session, drill_id: int, seen: Entry) -> tuple[Entry, str | None] | None:
    """The record's latest entry now and what the record digests to, when they still differ
    (None: they agree)."""
    now = _entries(s, "WHERE drill_id = :d", {"d": drill_id})
    e = now[-1] if now else seen
    if e.unreadable is not None:
        return e, None
    digest = (record_digests(s, [drill_id]) if e.format == VERSION else _legacy_digests(s, {drill_id: e})).get(drill_id)
    return None if digest == e.content_sha256 else (e, digest)


def _record_finding(drill_id: int, e: Entry, digest: str | None) -> Finding:
    subject = f"drill #{drill_id}"
    if e.unreadable is not None:
        return _problem(
            "entry-edited",
            f"entry {e.seq}",
            f"{e.where()} holds a value drill cannot read ({e.unreadable}): the entry was edited",
        )
    if digest is None:
        return _problem(
            "record-deleted", subject, f"{subject} is in the chain (entry {e.seq}) but its record is gone: deleted"
        )
    if digest == content.UNREADABLE:
        return _problem(
            "record-edited",
            subject,
            f"{subject} holds a value of a type drill never stores there: edited after it was recorded",
        )
    return _problem(
        "record-edited",
        subject,
        f"{subject} differs from the record sealed in entry {e.seq}: edited after it was recorded",
    )


# -- attesting records as they are read -------------------------------------------------------
def attest(s: Session, drill_ids: Collection[int], key: bytes | None) -> dict[int, RecordSeal]:
    """Each of these records against its latest entry, as a command reads them to show, select
    or report: the entry's own hash, its HMAC (with ``key``), its link to the entry after it,
    and the record's digest. A closed record without an entry, or one that does not match, is
    ``broken``; a drill still running is ``open`` (nothing to seal yet)."""
    from sqlalchemy import inspect

    ids = sorted(set(drill_ids))
    if not ids:
        return {}
    d = Drill.__table__
    status = dict(s.execute(select(d.c.id, d.c.status).where(d.c.id.in_(ids))).all())
    if not inspect(s.connection()).has_table(AuditEntry.__tablename__):
        return {i: RecordSeal("broken", "chain-missing", "the audit_log table is gone") for i in ids}
    latest: dict[int, Entry] = {}
    for i in range(0, len(ids), content.BATCH):
        for e in _entries(s, f"WHERE drill_id IN ({','.join(str(x) for x in ids[i : i + content.BATCH])})"):
            latest[e.drill_id] = e
    following = _following(s, latest.values())
    current = {i: e for i, e in latest.items() if e.unreadable is None}
    named: dict[int, list[str]] = {}
    digests = record_digests(s, [i for i, e in current.items() if e.format == VERSION], named)
    bad = broken_documents(s, [r for refs in named.values() for r in refs])
    digests.update(_legacy_digests(s, {i: e for i, e in current.items() if e.format < VERSION}))
    out = {}
    for drill_id in ids:
        found = latest.get(drill_id)
        if status.get(drill_id) == DrillStatus.RUNNING.value and found is None:
            out[drill_id] = RecordSeal("open")
        elif found is None:
            out[drill_id] = RecordSeal(
                "broken",
                "record-unsealed",
                f"drill #{drill_id} is closed but not in the audit chain: inserted or closed outside drill",
            )
        else:
            out[drill_id] = _seal_of(found, digests.get(drill_id), following.get(found.seq), key)
            broken = [d for d in named.get(drill_id, []) if d in bad]
            if broken and not out[drill_id].broken:
                out[drill_id] = RecordSeal(
                    "broken",
                    "record-edited",
                    f"drill #{drill_id}'s evidence document {broken[0]} is {bad[broken[0]]} after it was recorded",
                    found.seq,
                )
    return out


def _following(s: Session, entries: Collection[Entry]) -> dict[int, str | None]:
    """Entry seq → the prev_hash of the entry after it (None: it is the newest)."""
    seqs = sorted(e.seq + 1 for e in entries if e.unreadable is None)
    out: dict[int, str | None] = {seq - 1: None for seq in seqs}
    for i in range(0, len(seqs), content.BATCH):
        part = ",".join(str(x) for x in seqs[i : i + content.BATCH])
        for seq, prev in s.execute(text(f"SELECT seq, prev_hash FROM audit_log WHERE seq IN ({part})")):
            out[int(seq) - 1] = prev
    return out


def _seal_of(e: Entry, digest: str | None, next_prev: str | None, key: bytes | None) -> RecordSeal:
    if e.unreadable is not None:
        return RecordSeal(
            "broken", "entry-edited", f"{e.where()} holds a value drill cannot read: the entry was edited", e.seq
        )
    if _hash(e.message()) != e.hash:
        return RecordSeal(
            "broken", "entry-edited", f"{e.where()} does not match its own hash: the entry was edited", e.seq
        )
    if next_prev is not None and next_prev != e.hash:
        return RecordSeal(
            "broken", "link-broken", f"the entry after {e.where()} does not follow it: the log was rewritten", e.seq
        )
    if key is not None:
        problems = _mac_problems(e, e.message(), key, None, None)
        if problems:
            return RecordSeal("broken", problems[0].code, problems[0].message, e.seq)
    if digest != e.content_sha256:
        what = (
            "its record is gone"
            if digest is None
            else "the record differs from what was sealed: edited after it was recorded"
        )
        return RecordSeal(
            "broken", "record-edited", f"drill #{e.drill_id} fails its seal (entry {e.seq}): {what}", e.seq
        )
    return RecordSeal("intact", entry=e.seq)


# -- the passes of drill audit verify --------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Pass:
    """A full pass of ``drill audit verify``: when, how far, and what it found."""

    verified_at: datetime
    seq: int
    hash: str
    intact: bool
    problems: int

    def message(self) -> bytes:
        return "|".join(
            [
                "drill-audit-pass/1",
                str(self.seq),
                self.hash,
                self.verified_at.isoformat(),
                str(self.intact),
                str(self.problems),
            ]
        ).encode()

    def to_dict(self) -> dict[str, Any]:
        return {
            "verified_at": self.verified_at.isoformat(),
            "seq": self.seq,
            "hash": self.hash,
            "intact": self.intact,
            "problems": self.problems,
        }


def record_pass(s: Session, report: ChainReport, key: bytes | None) -> Pass:
    """Record a full pass, intact or not (with ``key``, under its HMAC)."""
    h = report.head
    broken = sum(1 for p in report.problems if p.severity is Severity.ERROR)
    done = Pass(datetime.now(timezone.utc), h.seq if h else 0, h.hash if h else GENESIS, report.intact, broken)
    s.add(
        AuditVerified(
            seq=done.seq,
            hash=done.hash,
            drill_id=h.drill_id if h else 0,
            sealed_at=h.sealed_at if h else done.verified_at,
            drills_through=s.scalar(select(func.max(Drill.id))) or 0,
            verified_at=done.verified_at,
            full=True,
            mac=hmac.new(key, done.message(), hashlib.sha256).hexdigest() if key else None,
            intact=done.intact,
            problems=broken,
        )  # fmt: skip
    )
    return done


def last_pass(s: Session, key: bytes | None) -> Pass | None:
    """The newest full pass recorded; with ``key``, only one that carries that key's HMAC."""
    from sqlalchemy import inspect

    if not inspect(s.connection()).has_table(AuditVerified.__tablename__):
        return None
    try:
        row = s.scalars(
            select(AuditVerified).where(AuditVerified.full.is_(True)).order_by(AuditVerified.id.desc()).limit(1)
        ).first()
    except (ValueError, TypeError):
        return None
    if row is None:
        return None
    done = Pass(_time(row.verified_at), row.seq, row.hash, bool(row.intact), int(row.problems or 0))
    if key is not None and not (
        row.mac is not None and hmac.compare_digest(row.mac, hmac.new(key, done.message(), hashlib.sha256).hexdigest())
    ):
        return None
    return done


def chain_head(s: Session) -> ChainHead | None:
    e = s.scalars(select(AuditEntry).order_by(AuditEntry.seq.desc()).limit(1)).first()
    return ChainHead(e.seq, e.hash, e.drill_id, e.sealed_at) if e else None


__all__ = [
    "GENESIS",
    "ChainHead",
    "ChainReport",
    "Entry",
    "Pass",
    "attest",
    "chain_head",
    "last_pass",
    "load_audit_key",
    "broken_documents",
    "record_digests",
    "record_pass",
    "seal_drill",
    "seal_drills",
    "verify_chain",
]
