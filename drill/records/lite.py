"""The coverage ledger over the standard library's ``sqlite3``, for ``drill verify``.

Importing SQLAlchemy takes 0.15–0.25 s, longer than hashing a gigabyte; a verification needs
five statements on two tables. This ledger writes exactly the rows
:class:`~drill.records.ledger.LedgerMixin` writes (a test holds the two to the same database
contents) and is used only on an SQLite file already at the schema head. Anything else — a
PostgreSQL URL, a file not created yet, a schema to migrate — goes through
:func:`drill.records.db.open_database`, which creates and upgrades.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

from drill.errors import DatabaseError
from drill.integrity.coverage import (
    AGAIN,
    CoverageUpdate,
    fingerprint_after,
    ledger_writes,
    proven_again,
    share_after,
)
from drill.records.urls import SCHEMA_HEAD, sqlite_busy_timeout, sqlite_pragmas
from drill.text import lossless

STAMP = "%Y-%m-%d %H:%M:%S.%f"
"""How SQLAlchemy stores a DateTime in SQLite: naive, UTC by drill's convention."""
NEVER = datetime.min.replace(tzinfo=timezone.utc)
"""When a proof whose time cannot be read was made: it proves nothing, and goes first."""


class Ledger(Protocol):
    """What a verification reads and writes: implemented by :class:`~drill.records.store.Records`
    (any database) and :class:`SqliteLedger` (the embedded one, without SQLAlchemy)."""

    def ensure_checkpoint(self, *, run_root: str, uri: str, step: int | None, format: str) -> int: ...

    def last_verified(self, checkpoint_id: int | None) -> dict[str, tuple[datetime, str]]: ...

    def apply_coverage(
        self, checkpoint_id: int, drill_id: int | None, update: CoverageUpdate, days: float
    ) -> float: ...

    def close(self) -> None: ...


class SqliteLedger:
    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        self.conn, self.path = conn, path

    @classmethod
    def at_head(cls, path: str) -> SqliteLedger | None:
        """The ledger of the SQLite file at ``path``; None when it is not there yet or its
        schema is not at head (the full path creates and upgrades it)."""
        if not Path(path).is_file():
            return None
        try:
            conn = sqlite3.connect(path, timeout=sqlite_busy_timeout(), isolation_level=None)
        except sqlite3.Error:
            return None
        try:
            sqlite_pragmas(conn)
            row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        except sqlite3.Error:
            row = None
        if row is None or row[0] != SCHEMA_HEAD:
            conn.close()
            return None
        return cls(conn, path)

    @contextmanager
    def _transaction(self, write: bool = True) -> Iterator[sqlite3.Connection]:
        """A transaction; one that writes takes the write lock at once (as the record store's
        do), one that reads takes none."""
        try:
            self.conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield self.conn
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            self.conn.execute("COMMIT")
        except sqlite3.Error as exc:
            err = DatabaseError(f"database {self.path}: {exc}")
            err.transient = isinstance(exc, sqlite3.OperationalError)
            raise err from None

    def ensure_checkpoint(self, *, run_root: str, uri: str, step: int | None, format: str) -> int:
        """The checkpoint's id, recording it first if it is new (insert-or-nothing, as
        :func:`~drill.records.store.checkpoint_row`)."""
        now = _stamp(datetime.now(timezone.utc))
        with self._transaction() as c:
            c.execute(
                "INSERT INTO checkpoints (run_root, uri, step, format, first_seen, last_seen) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (uri) DO NOTHING",
                (lossless(run_root), lossless(uri), step, format, now, now),
            )
            c.execute("UPDATE checkpoints SET last_seen = ? WHERE uri = ?", (now, lossless(uri)))
            return int(c.execute("SELECT id FROM checkpoints WHERE uri = ?", (lossless(uri),)).fetchone()[0])

    def last_verified(self, checkpoint_id: int | None) -> dict[str, tuple[datetime, str]]:
        if checkpoint_id is None:
            return {}
        with self._transaction(write=False) as c:
            return {path: (stored_time(at), digest) for path, digest, at in self._proofs(c, checkpoint_id)}

    def apply_coverage(self, checkpoint_id: int, drill_id: int | None, update: CoverageUpdate, days: float) -> float:
        now = datetime.now(timezone.utc)
        stamp = _stamp(now)
        with self._transaction() as c:
            held = c.execute("SELECT proofs_fingerprint FROM checkpoints WHERE id = ?", (checkpoint_id,)).fetchone()
            if held is not None and proven_again(update, held[0]):  # a nightly verify of an unchanged checkpoint
                c.execute("UPDATE checkpoints SET proofs_verified_at = ? WHERE id = ?", (stamp, checkpoint_id))
                return share_after(update, [], AGAIN, now, stored_time, days)
            rows = c.execute(_PROOFS.format(columns="f.path, f.size, f.xxh3_128"), (checkpoint_id,)).fetchall()
            stored = {path: (size, digest) for path, size, digest, _ in rows}
            writes = ledger_writes(update, stored)
            if writes.redate_all:
                c.execute("UPDATE checkpoints SET proofs_verified_at = ? WHERE id = ?", (stamp, checkpoint_id))
            c.executemany(  # one statement for every file: thousands of small files cost one round trip
                "INSERT INTO file_verifications (checkpoint_id, path, size, xxh3_128, verified_at, drill_id) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (checkpoint_id, path) DO UPDATE SET size = excluded.size, xxh3_128 = excluded.xxh3_128, "
                "verified_at = excluded.verified_at, drill_id = excluded.drill_id",
                [(checkpoint_id, lossless(p), *update.verified[p], stamp, drill_id) for p in writes.write],
            )
            c.executemany(
                "DELETE FROM file_verifications WHERE checkpoint_id = ? AND path = ?",
                [(checkpoint_id, lossless(p)) for p in writes.forget],
            )
            c.execute(
                "UPDATE checkpoints SET proofs_fingerprint = ? WHERE id = ?",
                (fingerprint_after(stored, update, writes), checkpoint_id),
            )
        return share_after(update, rows, writes, now, stored_time, days)

    @staticmethod
    def _proofs(c: sqlite3.Connection, checkpoint_id: int) -> list[tuple[str, str, str]]:
        return c.execute(_PROOFS.format(columns="f.path, f.xxh3_128"), (checkpoint_id,)).fetchall()

    def close(self) -> None:
        self.conn.close()


_PROOFS = (
    "SELECT {columns}, CASE WHEN c.proofs_verified_at > f.verified_at THEN c.proofs_verified_at ELSE f.verified_at END "
    "FROM file_verifications f JOIN checkpoints c ON c.id = f.checkpoint_id WHERE f.checkpoint_id = ?"
)
"""A checkpoint's proofs, each with its time: the later of its own and the checkpoint's sweep
(:func:`drill.records.models.proof_time`, in this ledger's own SQL)."""


def _stamp(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime(STAMP)


def stored_time(value: str | datetime | None) -> datetime:
    """A proof's time as stored — SQLite's text, PostgreSQL's timestamp — made aware (UTC);
    :data:`NEVER` when it cannot be read: a damaged row makes its file due, not the drill fail."""
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
    try:
        return datetime.fromisoformat(str(value)).replace(tzinfo=timezone.utc)
    except (TypeError, ValueError):
        return NEVER
