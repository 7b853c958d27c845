"""Where the record database is, and what every connection to it needs — without SQLAlchemy.

``drill verify`` opens the embedded SQLite file through the standard library (see
:mod:`drill.records.lite`); everything else through :mod:`drill.records.db`. Both take the URL,
the lock timeout, the connection settings and the schema head from here.
"""

from __future__ import annotations

import errno
import os
import re
import sqlite3
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from drill.errors import UsageError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

SCHEMA_HEAD = "0014"
"""The newest migration's revision: a database already there needs no Alembic at all (importing
it and reading the migration scripts costs a tenth of a second per command). A test checks
this against Alembic's own head."""


DATABASE_ENV = "DRILL_DATABASE_URL"


def default_database_path() -> Path:
    """``$XDG_DATA_HOME/drill/drill.db``, i.e. ``~/.local/share/drill/drill.db`` by default."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "drill" / "drill.db"


SCHEMES = ("sqlite", "postgresql", "postgres", "postgresql+psycopg")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


def resolve_url(value: str | None = None) -> str:
    """``--db`` wins, then ``$DRILL_DATABASE_URL``, then the embedded SQLite file.

    A plain path is an SQLite file; ``postgresql://`` means psycopg 3. Anything that looks
    like a URL of another kind — or a mistyped one (``postgresql:/host/db``) — is refused,
    rather than silently becoming a file named after it.
    """
    value = value or os.environ.get(DATABASE_ENV) or str(default_database_path())
    scheme = _SCHEME.match(value)
    if scheme and len(scheme.group(1)) > 1 and not value.startswith("file:"):  # not a drive letter or file:
        name = scheme.group(1).lower()
        if name not in SCHEMES or "://" not in value:
            raise UsageError(f"--db {safe_url(value)!r}: expected sqlite:///PATH, postgresql://HOST/DB or a file path")
    if "://" not in value:
        value = f"sqlite:///{os.path.abspath(os.path.expanduser(value))}"
    for prefix in ("postgresql://", "postgres://"):
        if value.startswith(prefix):
            return "postgresql+psycopg://" + value[len(prefix) :]
    if value.startswith("sqlite:") and _in_memory(value):
        raise UsageError(
            f"--db {value}: an in-memory SQLite database keeps no record past the command that opened it: name a file"
        )
    if value.startswith("sqlite:///"):
        _a_file_or_none(value[len("sqlite:///") :].partition("?")[0])
    return value


def _in_memory(url: str) -> bool:
    """Whether an ``sqlite:`` URL names a database that lives in memory (no path, ``:memory:``,
    a ``file::memory:`` URI, ``mode=memory``): each connection drill opens would be a new,
    empty one, and a drill's record would vanish with it."""
    path, _, query = url.partition("://")[2].partition("?")
    path = path[1:] if path.startswith("/") else path
    return path in ("", ":memory:") or path.startswith("file::memory:") or "mode=memory" in query


def _a_file_or_none(path: str) -> None:
    """An SQLite database is a regular file, or not there yet: a FIFO under its name blocked
    every command in the open — past SIGTERM — and a device is no database."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:  # no file can be there, or be made there
            raise UsageError(f"--db {path[:200]}…: a path longer than this system allows") from None
        return  # not there (it will be created), or not reachable (opening it will say so)
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO, socket or device"
        raise UsageError(f"--db {path}: {kind}, not an SQLite database file")


def database_key(url: str) -> str:
    """What names a database in the spool: its URL (as :func:`resolve_url` gives it) without a
    password — plain text rules, no SQLAlchemy, so a trainer's host can spool a record for the
    price of writing a file."""
    return re.sub(r"(://[^:@/]*):[^@/]*@", r"\1@", str(url))


def safe_url(url: str | URL) -> str:
    """The URL with any password masked: the only form drill ever prints or logs."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return re.sub(r"://[^@/]*@", "://***@", str(url))


def url_without_password(url: str | URL) -> str:
    """The URL as a command line may carry it: no password at all (the database's own means —
    a ``.pgpass`` file, ``$PGPASSWORD``, trust — supply one), never a masked one."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url)._replace(password=None).render_as_string(hide_password=False)
    except (ArgumentError, ValueError):
        return re.sub(r"://([^:@/]*):[^@/]*@", r"://\1@", str(url))


def sqlite_busy_timeout() -> float:
    """Seconds an SQLite writer waits for a lock (``$DRILL_SQLITE_BUSY_TIMEOUT``, default 30)."""
    try:
        return max(0.0, float(os.environ.get("DRILL_SQLITE_BUSY_TIMEOUT", "30")))
    except ValueError:
        return 30.0


DATABASE_TIMEOUT = 120.0
"""Seconds one transaction may take, all of it, before the database counts as away."""


def database_timeout() -> float:
    """Seconds one database transaction may take in all (``$DRILL_DATABASE_TIMEOUT``, default
    120): past it, a PostgreSQL connection is cut and the drill goes on without the database
    (its verdict spooled). A value that is not a positive number is a usage error."""
    raw = os.environ.get("DRILL_DATABASE_TIMEOUT")
    if raw is None:
        return DATABASE_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (value > 0 and value < 1e9):
        from drill.errors import UsageError

        raise UsageError(f"$DRILL_DATABASE_TIMEOUT={raw!r}: expected a positive number of seconds")
    return value


def sqlite_pragmas(dbapi_conn, _record=None) -> None:  # type: ignore[no-untyped-def]
    """Foreign keys on, and write-ahead logging: readers never wait for the writer."""
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA foreign_keys=ON")
    mode = cur.execute("PRAGMA journal_mode").fetchone()
    if mode and str(mode[0]).lower() != "wal":
        try:
            cur.execute("PRAGMA journal_mode=WAL")
        except sqlite3.OperationalError:
            pass  # a read-only connection keeps the file's journal mode
    cur.close()
