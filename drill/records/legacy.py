"""Records sealed by drill 0.5 and earlier (``drill-audit/1`` and ``/2`` entries): their
content digested as canonical JSON of the values the ORM reads back. Only those entries are
verified this way; drill now seals with :mod:`drill.records.content`, which reads records as
stored and is what makes a full pass over a year of records seconds.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from drill.errors import one_line
from drill.records.models import Checkpoint, CheckRecord, Drill, ReplayStep


def _plain(row: Mapping[str, Any], drop: tuple[str, ...]) -> dict[str, Any]:
    return {
        k: (v.astimezone(timezone.utc).isoformat() if isinstance(v, datetime) else v)
        for k, v in row.items()
        if k not in drop
    }


LATER_COLUMNS = ("options",)
"""Columns of ``drills`` added after ``drill-audit/1`` entries were written: their digests never
covered them, so verifying one of those leaves them out."""


def digest(
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


class Contents:
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
        return digest(row, self.uris.get(row["checkpoint_id"]), self.checks[drill_id], self.steps[drill_id], legacy)


__all__ = ["LATER_COLUMNS", "Contents", "digest"]
