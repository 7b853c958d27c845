"""Saves sealed as they were written: one row per checkpoint a sealing save wrote, with the
seal's cost. Spooled on the trainer's host (a file, no database layer there), delivered
exactly once (a row is keyed by where and when it was saved)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from drill.pipeline.outcome import check_version
from drill.records.models import Save
from drill.records.spool import SAVE_FIELDS as FIELDS
from drill.records.spool import SAVE_KIND as KIND
from drill.records.spool import SAVE_VERSION, is_save


class SavesMixin:
    _session: Callable[[], AbstractContextManager[Session]]  # provided by Records

    def record_save(self, doc: dict[str, Any]) -> bool:
        """Insert a save's document; False when the same save (host, pid, time, checkpoint) is
        already there — a spooled copy delivered twice."""
        check_version(doc, SAVE_VERSION, "save")
        missing = [f for f in FIELDS if f not in doc]
        if missing:
            raise ValueError(f"not a save document: no {', '.join(missing)}")
        saved_at = datetime.fromisoformat(doc["saved_at"])
        with self._session() as s:
            twin = s.scalar(
                select(Save.id).where(
                    Save.host == doc["host"],
                    Save.pid == int(doc["pid"]),
                    Save.saved_at == saved_at,
                    Save.checkpoint_uri == doc["checkpoint"],
                )
            )
            if twin is not None:
                return False
            s.add(Save(
                checkpoint_uri=str(doc["checkpoint"]), run_root=str(doc["run_root"]), step=doc["step"], method=str(doc["method"]), files=int(doc["files"]),
                bytes=int(doc["bytes"]), hash_seconds=float(doc["hash_seconds"]), save_seconds=float(doc["save_seconds"]),
                bytes_read_back=int(doc["bytes_read_back"]), keyed=bool(doc["keyed"]), host=str(doc["host"]), pid=int(doc["pid"]),
                saved_at=saved_at, drill_version=str(doc["drill_version"]),
            ))  # fmt: skip
        return True

    def saves(self, run_root: str | None = None, checkpoints: Collection[str] | None = None) -> list[dict[str, Any]]:
        """Recorded saves, newest first (of one run when ``run_root`` is given, of these
        ``checkpoints`` when given)."""
        with self._session() as s:
            query = select(Save).order_by(Save.saved_at.desc())
            if run_root is not None:
                query = query.where(Save.run_root == run_root)
            if checkpoints is not None:
                query = query.where(Save.checkpoint_uri.in_(sorted(set(checkpoints))))
            return [
                {"checkpoint": r.checkpoint_uri, "run_root": r.run_root, "step": r.step, "method": r.method, "files": r.files, "bytes": r.bytes,
                 "hash_seconds": r.hash_seconds, "save_seconds": r.save_seconds, "bytes_read_back": r.bytes_read_back, "keyed": r.keyed,
                 "host": r.host, "pid": r.pid, "saved_at": r.saved_at.isoformat(), "drill_version": r.drill_version}
                for r in s.scalars(query)
            ]  # fmt: skip


__all__ = ["FIELDS", "KIND", "SavesMixin", "is_save"]
