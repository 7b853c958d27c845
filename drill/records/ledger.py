"""The coverage ledger: per sealed file, when its bytes last matched their digest."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timezone
from typing import Any, cast

from sqlalchemy import Select, String, Table, bindparam, delete, insert, select, type_coerce
from sqlalchemy import update as update_rows
from sqlalchemy.orm import Session

from drill.integrity.coverage import (
    AGAIN,
    CoverageUpdate,
    fingerprint_after,
    ledger_writes,
    proven_again,
    share_after,
)
from drill.records.lite import stored_time
from drill.records.models import Checkpoint, FileVerification, proof_time
from drill.records.rows import checkpoint_row


class LedgerMixin:
    _session: Callable[[], AbstractContextManager[Session]]  # provided by Records

    def checkpoint_id(self, uri: str) -> int | None:
        with self._session() as s:
            return s.scalar(select(Checkpoint.id).where(Checkpoint.uri == uri))

    def ensure_checkpoint(self, *, run_root: str, uri: str, step: int | None, format: str) -> int:
        """The checkpoint's id, recording it first if it is new."""
        from drill.pipeline.outcome import CheckpointInfo

        info = CheckpointInfo(uri=uri, name=uri.rstrip("/").rsplit("/", 1)[-1], step=step, format=format)
        with self._session() as s:
            return checkpoint_row(s, run_root, info).id

    def last_verified(self, checkpoint_id: int | None) -> dict[str, tuple[datetime, str]]:
        """Path → (when it last matched, the digest it matched)."""
        if checkpoint_id is None:
            return {}
        with self._session() as s:
            return {path: (when, digest) for path, (digest, when) in _proofs(s, checkpoint_id).items()}

    def apply_coverage(self, checkpoint_id: int, drill_id: int | None, update: CoverageUpdate, days: float) -> float:
        """Record the files that matched, forget the ones that failed, and return the share of
        the checkpoint's sealed bytes verified within ``days`` — in statements over many rows
        each (:func:`~drill.integrity.coverage.ledger_writes`), never an object per file; where
        exactly the proofs held were made again (their fingerprint), one row re-dates them all."""
        now = datetime.now(timezone.utc)
        table = cast(Table, FileVerification.__table__)
        of_checkpoint = table.c.checkpoint_id == checkpoint_id
        checkpoint = update_rows(Checkpoint).where(Checkpoint.id == checkpoint_id)
        with self._session() as s:
            held = s.scalar(select(Checkpoint.proofs_fingerprint).where(Checkpoint.id == checkpoint_id))
            if proven_again(update, held):  # a nightly verify of an unchanged checkpoint
                s.execute(checkpoint.values(proofs_verified_at=now))
                return share_after(update, [], AGAIN, now, stored_time, days)
            rows = s.execute(_proof_query(checkpoint_id, table.c.path, table.c.size, table.c.xxh3_128)).all()
            stored = {path: (size, digest) for path, size, digest, _ in rows}
            writes = ledger_writes(update, stored)
            if writes.redate_all:
                s.execute(checkpoint.values(proofs_verified_at=now))
            fields = [{"p": p, "size": update.verified[p][0], "xxh3_128": update.verified[p][1]} for p in writes.write]
            if changed := [f for f in fields if f["p"] in stored]:
                where = of_checkpoint & (table.c.path == bindparam("p"))
                s.execute(update_rows(table).where(where).values(verified_at=now, drill_id=drill_id), changed)
            if new := [f for f in fields if f["p"] not in stored]:
                s.execute(
                    insert(table),
                    [
                        {"checkpoint_id": checkpoint_id, "path": f["p"], "size": f["size"], "xxh3_128": f["xxh3_128"]}
                        | {"verified_at": now, "drill_id": drill_id}
                        for f in new
                    ],
                )
            if writes.forget:
                s.execute(delete(table).where(of_checkpoint & table.c.path.in_(writes.forget)))
            s.execute(checkpoint.values(proofs_fingerprint=fingerprint_after(stored, update, writes)))
        return share_after(update, rows, writes, now, stored_time, days)


def _proof_query(checkpoint_id: int, *columns: Any) -> Select[Any]:
    """``columns`` of the checkpoint's proofs and, last, each one's time as stored (SQLite: its
    text; PostgreSQL: a datetime) — the later of its own and the checkpoint's sweep."""
    when = type_coerce(proof_time(), String)
    return (
        select(*columns, when)
        .join(Checkpoint, Checkpoint.id == FileVerification.checkpoint_id)
        .where(FileVerification.checkpoint_id == checkpoint_id)
    )


def _proofs(s: Session, checkpoint_id: int) -> dict[str, tuple[str, datetime]]:
    """Path → (digest, when) of the checkpoint's proofs; a time stored unreadably (a damaged
    SQLite row) counts as never (see :func:`~drill.records.lite.stored_time`)."""
    query = _proof_query(checkpoint_id, FileVerification.path, FileVerification.xxh3_128)
    return {path: (digest, stored_time(at)) for path, digest, at in s.execute(query)}


__all__ = ["LedgerMixin"]
