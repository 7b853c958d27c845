"""Which coverage ledger a database gets: plain ``sqlite3`` for an SQLite file at head (no
SQLAlchemy import on ``drill verify``'s path), SQLAlchemy for everything else."""

from __future__ import annotations

from typing import Any

from drill.records.lite import Ledger, SqliteLedger
from drill.records.urls import resolve_url


def open_ledger(url: str | None = None) -> Ledger:
    """The coverage ledger of the record database at ``url`` (``--db``, the environment, or
    the embedded default): over ``sqlite3`` when that is an SQLite file at head, else
    through SQLAlchemy (which creates, upgrades, or reaches PostgreSQL)."""
    resolved = resolve_url(url)
    if resolved.startswith("sqlite:///") and "?" not in resolved:
        ledger = SqliteLedger.at_head(resolved[len("sqlite:///") :])
        if ledger is not None:
            return ledger
    from drill.records.db import open_database
    from drill.records.store import Records

    return _RecordsLedger(Records(open_database(url)))


class _RecordsLedger:
    """:class:`~drill.records.store.Records` as a :class:`Ledger` that closes its database."""

    def __init__(self, records: Any) -> None:
        self.records = records
        self.ensure_checkpoint = records.ensure_checkpoint
        self.last_verified = records.last_verified
        self.apply_coverage = records.apply_coverage

    def close(self) -> None:
        self.records.db.close()
