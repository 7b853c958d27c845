"""Restore bursts on the record: one row per ``drill burst``, its sweep kept whole."""

from __future__ import annotations

import socket
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from drill.records.models import Burst


class BurstsMixin:
    _session: Callable[[], AbstractContextManager[Session]]  # provided by Records

    def record_burst(self, run_root: str, document: dict[str, Any], started_at: datetime | None = None) -> int:
        """Keep a burst's document (:meth:`drill.burst.BurstResult.to_dict`); returns its id."""
        from drill import __version__

        with self._session() as s:
            row = Burst(
                run_root=run_root, checkpoint_uri=document["checkpoint"], started_at=started_at or datetime.now(timezone.utc),
                host=socket.gethostname(), bytes=int(document["bytes"]), cold=bool(document["cold"]), replicated=bool(document["replicated"]),
                max_readers=max((st["readers"] for st in document["steps"]), default=0), ceiling_bps=document.get("ceiling_bps"),
                ceiling_readers=document.get("ceiling_readers"), document=document, drill_version=__version__,
            )  # fmt: skip
            s.add(row)
            s.flush()
            return row.id

    def bursts(self, run_root: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        """Recorded bursts, newest first: their documents, with id, run root, host and time."""
        with self._session() as s:
            query = select(Burst).order_by(Burst.started_at.desc(), Burst.id.desc()).limit(limit)
            if run_root is not None:
                query = query.where(Burst.run_root == run_root)
            return [
                {
                    "id": b.id,
                    "run_root": b.run_root,
                    "host": b.host,
                    "started_at": b.started_at.isoformat(),
                    **b.document,
                }
                for b in s.scalars(query)
            ]

    def burst(self, burst_id: int) -> dict[str, Any]:
        """One recorded burst; :class:`~drill.errors.NotFound` when there is none."""
        from drill.errors import NotFound

        with self._session() as s:
            b = s.get(Burst, burst_id)
            if b is None:
                raise NotFound(f"no burst #{burst_id} in this database (drill history --bursts lists them)")
            return {
                "id": b.id,
                "run_root": b.run_root,
                "host": b.host,
                "started_at": b.started_at.isoformat(),
                **b.document,
            }

    def latest_bursts(self) -> dict[str, dict[str, Any]]:
        """The newest burst of every run root."""
        out: dict[str, dict[str, Any]] = {}
        for doc in reversed(self.bursts(limit=10_000)):
            out[doc["run_root"]] = doc
        return out


__all__ = ["BurstsMixin"]
