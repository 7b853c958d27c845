"""The coverage ledger: per sealed file, when its bytes last matched their digest."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timezone
from typing import cast

from sqlalchemy import String, Table, bindparam, delete, insert, select, type_coerce
from sqlalchemy import update as update_rows
from sqlalchemy.orm import Session

from drill.integrity.coverage import CoverageUpdate, ledger_writes, share_after
from drill.records.lite import stored_time
from drill.records.models import Checkpoint, FileVerification
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
        each (:func:`~drill.integrity.coverage.ledger_writes`), never an object per file."""
        now = datetime.now(timezone.utc)
        table = cast(Table, FileVerification.__table__)
        of_checkpoint = table.c.checkpoint_id == checkpoint_id
        with self._session() as s:
            raw = type_coerce(table.c.verified_at, String)  # SQLite: the stored text; PostgreSQL: a datetime
            rows = s.execute(select(table.c.path, table.c.size, table.c.xxh3_128, raw).where(of_checkpoint)).all()
            stored = {path: (size, digest) for path, size, digest, _ in rows}
            writes = ledger_writes(update, stored)
            if writes.redate_all:
                s.execute(update_rows(table).where(of_checkpoint).values(verified_at=now, drill_id=drill_id))
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
        return share_after(update, rows, writes, now, stored_time, days)


def _proofs(s: Session, checkpoint_id: int) -> dict[str, tuple[str, datetime]]:
    """Path → (digest, when) of the checkpoint's proofs; a time stored unreadably (a damaged
    SQLite row) counts as never (see :func:`~drill.records.lite.stored_time`)."""
    raw = type_coerce(FileVerification.verified_at, String)  # SQLite: the stored text; PostgreSQL: a datetime
    query = select(FileVerification.path, FileVerification.xxh3_128, raw).where(
        FileVerification.checkpoint_id == checkpoint_id
    )
    return {path: (digest, stored_time(at)) for path, digest, at in s.execute(query)}


__all__ = ["LedgerMixin"]
