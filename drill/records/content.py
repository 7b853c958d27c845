"""A drill record's content as the audit log seals it (``drill-audit/3``), read as stored.

The digest of a record covers its ``drills`` row (every column but ``checkpoint_id``, which
the checkpoint's URI stands for), that URI, its ``check_results`` rows and its
``replay_steps`` rows, each in the order they were written — exactly as the database holds
them, never through the ORM: no JSON is parsed, no time converted, no object built. The
database renders each row as one byte string in SQL, every value framed so no two rows
render alike:

- SQLite: each value as ``typeof:length:bytes`` — the type it is stored as, its length in
  bytes, its bytes (so a stored NUL, a text put where a number was, a value moved from one
  column to the next all change the string);
- PostgreSQL: each value quoted as a literal (``quote_nullable``), times in UTC to the
  microsecond, ``jsonb`` in its canonical text.

Floating-point values are the one exception: a database's text for a double differs between
versions and platforms (SQLite's ``printf`` in long double), so the row's string says only
whether each is NULL, and the double itself is fetched and hashed as its eight IEEE-754 bytes.

The columns sealed are listed here, by name, for good: a column added to a table later is not
sealed by this version (a test names every column as sealed or not), so the records sealed
before it keep their digests. A record's digest is ``SHA-256("drill-record/3" | D row | uri
| C row … | S row …)``. Rendering in SQL is what makes a full pass over a year of records a
few seconds: the Python cost per row is one fetch and one hash update.
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

TAG = b"drill-record/3"


@dataclass(frozen=True, slots=True)
class Part:
    """One table's share of a record: which of its columns are sealed, and in what order."""

    table: str
    tag: bytes
    columns: tuple[tuple[str, str], ...]
    """(column, kind): ``int``, ``text`` (short), ``long`` (text or JSON of any length), ``time``
    or ``float``."""

    def of(self, kind: str) -> tuple[str, ...]:
        return tuple(c for c, k in self.columns if k == kind)


DRILL = Part(
    "drills",
    b"D",
    (
        ("id", "int"), ("run_root", "text"), ("selector", "text"), ("trigger", "text"), ("host", "text"),
        ("pid", "int"), ("device", "text"), ("started_at", "time"), ("finished_at", "time"), ("status", "text"),
        ("exit_code", "int"), ("message", "long"), ("process_start", "int"), ("phase", "text"), ("error", "long"),
        ("restore_seconds", "float"), ("discover_seconds", "float"), ("read_seconds", "float"),
        ("load_seconds", "float"), ("plan_seconds", "float"), ("checks_seconds", "float"),
        ("replay_seconds", "float"), ("bytes_read", "int"), ("throughput_bps", "float"),
        ("drill_version", "text"), ("torch_version", "text"), ("sample", "text"), ("evidence_level", "text"),
        ("ttfs_seconds", "float"), ("replay_verdict", "text"), ("replay_reason", "long"), ("policy", "text"),
        ("selection", "long"), ("slo_breaches", "long"), ("distributed", "long"), ("page_cache", "long"),
        ("job_id", "text"), ("options", "long"), ("details", "long"),
    ),
)  # fmt: skip
CHECKS = Part(
    "check_results",
    b"C",
    (("name", "text"), ("status", "text"), ("summary", "long"), ("evidence", "long"), ("seconds", "float")),
)
STEPS = Part(
    "replay_steps",
    b"S",
    (
        ("step", "int"), ("reference_loss", "float"), ("loss", "float"), ("reference_grad_norm", "float"),
        ("grad_norm", "float"), ("reference_batch", "text"), ("batch", "text"), ("matches", "int"),
        ("nonfinite", "long"),
    ),
)  # fmt: skip
PARTS = (DRILL, CHECKS, STEPS)
NOT_SEALED = {"drills": ("checkpoint_id",), "check_results": ("id", "drill_id"), "replay_steps": ("id", "drill_id")}
"""Columns a record's digest leaves out: the checkpoint's row id (its URI is sealed instead),
each row's own id and its drill's id (the record they belong to is what the digest is of)."""


# -- the SQL each database reads a row with -----------------------------------------------------
class _SQLite:
    @staticmethod
    def text(column: str, kind: str) -> str:
        return f"ifnull(CAST({column} AS BLOB),x'')"

    @staticmethod
    def number(column: str, kind: str) -> str:
        return f"ifnull({column},0)"

    @staticmethod
    def nulls(columns: list[str]) -> str:
        return "|".join(f"(({c} IS NULL)<<{i})" for i, c in enumerate(columns))


class _PostgreSQL:
    @staticmethod
    def text(column: str, kind: str) -> str:
        if kind == "time":  # in UTC to the microsecond, whatever the session's time zone
            column = f"""to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')"""
        return f"coalesce(convert_to({column}::text,'UTF8'),''::bytea)"

    @staticmethod
    def number(column: str, kind: str) -> str:
        return f"coalesce({column},0)::float8" if kind == "float" else f"coalesce({column}::int::bigint,0)"

    @staticmethod
    def nulls(columns: list[str]) -> str:
        return "|".join(f"(({c} IS NULL)::int::bigint<<{i})" for i, c in enumerate(columns))


def _dialect(name: str) -> type[_SQLite] | type[_PostgreSQL]:
    if name == "sqlite":
        return _SQLite
    if name == "postgresql":
        return _PostgreSQL
    raise ValueError(f"records on {name} cannot be sealed: SQLite and PostgreSQL only")


@functools.cache
def _texts(part: Part) -> list[tuple[str, str]]:
    return [(c, k) for c, k in part.columns if k in ("text", "long", "time")]


def _numbers(part: Part) -> list[tuple[str, str]]:
    """Integers first, then doubles: the order of the row's :func:`layout`."""
    return [(c, k) for c, k in part.columns if k == "int"] + [(c, k) for c, k in part.columns if k == "float"]


def head_format(part: Part, extra_texts: int = 0) -> str:
    """A row's fixed-size head, as :mod:`struct` packs it: which values are NULL (a bit each,
    in column order), the integers, the doubles, and the length of each text."""
    ints = sum(1 for c, k in part.columns if k == "int")
    floats = len(part.columns) - ints - len(_texts(part))
    return f"q{ints}q{floats}d{len(_texts(part)) + extra_texts}q"


def queries(dialect: str, where: str) -> list[tuple[Part, str]]:
    """Per part, the query of every row of the drills ``where`` selects (a condition on the
    drill id, written ``{id}``), ordered by drill and then as written: the drill id, the row's
    texts as bytes (the drill's row: its checkpoint's URI first), its NULLs as a bitmap, its
    integers, its doubles (a NULL read as 0 or empty: the bitmap says which it was)."""
    sql = _dialect(dialect)
    out = []
    for part, alias in ((DRILL, "d"), (CHECKS, "r"), (STEPS, "r")):
        texts = [(f"{alias}.{c}", k) for c, k in _texts(part)]
        if part is DRILL:
            texts.insert(0, ("k.uri", "text"))
        columns = [f"{alias}.{c}" for c, _ in part.columns] + (["k.uri"] if part is DRILL else [])
        select = ", ".join(
            [
                *(sql.text(c, k) for c, k in texts),
                sql.nulls(columns),
                *(sql.number(f"{alias}.{c}", k) for c, k in _numbers(part)),
            ]
        )
        if part is DRILL:
            source = f"drills d LEFT JOIN checkpoints k ON k.id = d.checkpoint_id WHERE {where.format(id='d.id')}"
            out.append((part, f"SELECT d.id, {select} FROM {source} ORDER BY d.id"))
        else:
            source = f"{part.table} r WHERE {where.format(id='r.drill_id')}"
            out.append((part, f"SELECT r.drill_id, {select} FROM {source} ORDER BY r.drill_id, r.id"))
    return out


# -- digests ------------------------------------------------------------------------------------
BATCH = 250
"""Records a caller asks :func:`digests` for at once: their rows are all in memory together."""
UNREADABLE = "unreadable"
"""What :func:`digests` gives a record with a value of a type drill never stores in its column
(a text where an integer was): edited outside drill."""


_NAMES = b'"$document"'


def documents_named(details: bytes) -> list[str]:
    """The :class:`~drill.records.models.Document` s a record's ``details`` names (``{"$document":
    SHA-256}``: sealed with the record; each document is verified by its name, the SHA-256 of
    its body). Found without parsing the JSON: a record is read, not decoded."""
    out = []
    at = details.find(_NAMES)
    while at >= 0:
        start = details.find(b'"', at + len(_NAMES)) + 1
        if start > 0:
            out.append(details[start : start + 64].decode("ascii", "replace"))
        at = details.find(_NAMES, at + len(_NAMES))
    return out


def digests(cursor: Any, dialect: str, ids: Sequence[int], refs: dict[int, list[str]] | None = None) -> dict[int, str]:
    """Drill id → the SHA-256 (hex) of its record's content, for the drills ``ids`` (sorted),
    read through the DB-API ``cursor``; :data:`UNREADABLE` for a record
    holding a value of the wrong type. A drill without a row has none. All of their rows are
    read at once: give it a few hundred drills at a time.

    With ``refs``, each drill's evidence documents (:func:`documents_named`) are added to it.

    A record reads as :data:`TAG`, then per part its tag, its row count, every row's
    fixed-size head (:func:`head_format`) and every row's texts: the heads say how long each
    text is, so no two records read alike whatever bytes their texts hold. Rows are taken a
    column at a time (``zip``, ``map``, one ``struct`` pack per part): no Python per row."""
    pieces: dict[int, list[bytes]] = {}
    unreadable: set[int] = set()
    where, params = _where(dialect, ids)
    for part, sql in queries(dialect, where):
        cursor.execute(sql, params)
        rows = cursor.fetchall()
        if rows:
            _add(part, rows, pieces, unreadable)
            if refs is not None and part is DRILL:
                column = 1 + len(_texts(DRILL))  # the drill's details: its last text
                for row in rows:
                    found = documents_named(row[column])
                    if found:
                        refs[row[0]] = found
    return {i: UNREADABLE if i in unreadable else hashlib.sha256(b"".join(p)).hexdigest() for i, p in pieces.items()}


def _add(part: Part, rows: list[Any], pieces: dict[int, list[bytes]], unreadable: set[int]) -> None:
    """One part's rows (ordered by drill) onto each drill's pieces."""
    n = len(_texts(part)) + (part is DRILL)
    fmt = head_format(part, part is DRILL)
    size = struct.calcsize("<" + fmt)
    columns = list(zip(*rows, strict=True))
    texts = columns[1 : 1 + n]
    try:
        heads = struct.pack(
            "<" + fmt * len(rows), *chain.from_iterable(zip(*columns[1 + n :], *map(_lengths, texts), strict=True))
        )
    except (struct.error, TypeError):  # a value of a type drill never stores: find whose
        heads = b"".join(_head(fmt, row, n, unreadable) for row in rows)
    flat = list(chain.from_iterable(zip(*texts, strict=True)))
    start = 0
    for drill_id, count in Counter(columns[0]).items():
        got = pieces.setdefault(drill_id, [TAG]) if part is DRILL else pieces.get(drill_id)
        if got is not None:  # rows of a drill with no drill row: that record is gone
            got += (part.tag, _COUNT(count), heads[start * size : (start + count) * size])
            got += flat[start * n : (start + count) * n]
        start += count


def _lengths(column: tuple[bytes, ...]) -> map[int]:
    return map(len, column)


def _head(fmt: str, row: Any, n: int, unreadable: set[int]) -> bytes:
    try:
        return struct.pack("<" + fmt, *row[1 + n :], *map(len, row[1 : 1 + n]))
    except (struct.error, TypeError):
        unreadable.add(row[0])
        return b"\0" * struct.calcsize("<" + fmt)


_COUNT = struct.Struct("<q").pack


def _where(dialect: str, ids: Sequence[int]) -> tuple[str, tuple[int, ...]]:
    """The condition selecting exactly ``ids`` (sorted): a range with parameters where they
    run unbroken (one statement the driver prepares once), else the list itself."""
    if ids and ids[-1] - ids[0] + 1 == len(ids):
        mark = "?" if dialect == "sqlite" else "%s"
        return f"{{id}} BETWEEN {mark} AND {mark}", (int(ids[0]), int(ids[-1]))
    listed = ",".join(str(int(i)) for i in ids) or "NULL"
    return f"{{id}} IN ({listed})", ()


__all__ = [
    "BATCH",
    "CHECKS",
    "DRILL",
    "documents_named",
    "NOT_SEALED",
    "PARTS",
    "STEPS",
    "TAG",
    "UNREADABLE",
    "Part",
    "digests",
    "queries",
]
