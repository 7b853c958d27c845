"""The coverage ledger: per sealed file, when its bytes last matched their digest."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta, timezone

from sqlalchemy import String, select, type_coerce
from sqlalchemy.orm import Session, load_only

from drill.integrity.coverage import CoverageUpdate, fresh_share
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
        the checkpoint's sealed bytes verified within ``days``."""
        now = datetime.now(timezone.utc)
        with self._session() as s:
            proofs = _proofs(s, checkpoint_id)
            # The rows without their times: a time that cannot be read is overwritten, not loaded.
            query = (
                select(FileVerification)
                .options(load_only(FileVerification.path))
                .where(FileVerification.checkpoint_id == checkpoint_id)
            )
            rows = {r.path: r for r in s.scalars(query)}
            for path, (size, digest) in update.verified.items():
                row = rows.get(path)
                if row is None:
                    row = rows[path] = FileVerification(
                        checkpoint_id=checkpoint_id, path=path, size=size, xxh3_128=digest, verified_at=now
                    )
                    s.add(row)
                row.size, row.xxh3_128, row.verified_at, row.drill_id = size, digest, now, drill_id
                proofs[path] = (digest, now)
            for path in update.broken & set(rows):
                s.delete(rows.pop(path))
                proofs.pop(path, None)
            return fresh_share(update, proofs, now - timedelta(days=days))


def _proofs(s: Session, checkpoint_id: int) -> dict[str, tuple[str, datetime]]:
    """Path → (digest, when) of the checkpoint's proofs; a time stored unreadably (a damaged
    SQLite row) counts as never (see :func:`~drill.records.lite.stored_time`)."""
    raw = type_coerce(FileVerification.verified_at, String)  # SQLite: the stored text; PostgreSQL: a datetime
    query = select(FileVerification.path, FileVerification.xxh3_128, raw).where(
        FileVerification.checkpoint_id == checkpoint_id
    )
    return {path: (digest, stored_time(at)) for path, digest, at in s.execute(query)}


__all__ = ["LedgerMixin"]
