"""Opening the record database and keeping its schema at Alembic's head.

The embedded default is an SQLite file that upgrades itself on first use. A shared
PostgreSQL database is upgraded only by ``drill db upgrade``: many hosts may point at it, and
a nightly drill must not migrate it behind an operator's back.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from drill.errors import DatabaseError, UsageError
from drill.records.urls import (  # noqa: F401 - the names callers import from here
    DATABASE_ENV,
    SCHEMA_HEAD,
    SCHEMES,
    database_timeout,
    default_database_path,
    resolve_url,
    safe_url,
    sqlite_busy_timeout,
    sqlite_pragmas,
)


def migrations_dir() -> Path:
    """``drill/_migrations`` in an installed wheel, else ``migrations/`` of the source tree."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "_migrations", here.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise DatabaseError(
        f"drill's migrations are missing (looked in {here / '_migrations'} and {here.parent / 'migrations'})"
    )


def alembic_config(connection=None):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    return SCHEMA_HEAD


def alembic_head() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def _current_revision(engine: Engine) -> str | None:
    """The revision stamped in ``alembic_version`` (None: no drill schema yet), read with plain
    SQL. drill's tables without a revision are a damaged database — never "nothing recorded
    yet" (an empty history), never migrated over — unless a first migration is under way in
    another process on this SQLite file (its lock is waited for, then the revision re-read)."""
    revision, tables = _stamp_and_tables(engine)
    if (
        revision is None
        and tables
        and engine.dialect.name == "sqlite"
        and engine.url.database not in (None, "", ":memory:")
    ):
        with _migrate_lock(str(engine.url.database), shared=True):
            revision, tables = _stamp_and_tables(engine)
    if revision is None and tables:
        raise _unstamped(engine)
    return revision


def _unstamped(engine: Engine) -> DatabaseError:
    return DatabaseError(
        f"database {safe_url(engine.url.render_as_string(hide_password=True))} holds drill's tables but no schema revision "
        "(alembic_version is missing or empty): it was damaged or edited outside drill; restore it from a backup, "
        "or stamp the revision it has: alembic stamp REVISION"
    )


def _stamp_and_tables(engine: Engine) -> tuple[str | None, bool]:
    from sqlalchemy import text

    with engine.connect() as conn:
        inspector = inspect(conn)
        row = (
            conn.execute(text("SELECT version_num FROM alembic_version")).first()
            if inspector.has_table("alembic_version")
            else None
        )
        return (None if row is None else str(row[0])), inspector.has_table("drills")


@contextmanager
def _migrate_lock(database: str, *, shared: bool = False) -> Iterator[None]:
    """The lock that serializes first use (migration) of one SQLite file across processes."""
    import fcntl

    fd = os.open(f"{database}.migrate-lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


_CONNECTIONS: weakref.WeakKeyDictionary[Engine, weakref.WeakSet[Any]] = weakref.WeakKeyDictionary()
"""Each PostgreSQL engine's DB-API connections, from the first: what :meth:`Database.bounded` cuts."""


def _track_connections(engine: Engine) -> None:
    live: weakref.WeakSet[Any] = weakref.WeakSet()
    _CONNECTIONS[engine] = live
    event.listen(engine, "connect", lambda conn, _record: live.add(conn))


def postgresql_bounds(timeout: float, given: dict[str, Any] | None = None) -> dict[str, Any]:
    """libpq's connection options that bound every wait on the server: the connection itself,
    a link that dies quietly (TCP keepalive; unacknowledged data), a statement, a transaction
    left idle. What none of these can see — a link that accepts bytes and never answers, a
    proxy that froze — :meth:`Database.bounded` cuts. What the URL already sets (``given``,
    its query) is kept: its ``options`` are added to, a setting it makes is not overridden."""
    given = {k: (v[-1] if isinstance(v, tuple) else v) for k, v in (given or {}).items()}
    ms = int(timeout * 1000)
    bounds: dict[str, Any] = {
        "connect_timeout": max(1, min(10, int(timeout))),
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": ms,
    }
    out = {k: v for k, v in bounds.items() if k not in given}
    options = str(given.get("options") or "")
    for name in ("statement_timeout", "idle_in_transaction_session_timeout"):
        if name not in options:
            options += f" -c {name}={ms}"
    out["options"] = options.strip()
    return out


@dataclass(slots=True)
class Database:
    url: str
    engine: Engine
    sessions: sessionmaker[Session]
    timeout: float = field(default_factory=lambda: database_timeout())
    """Seconds one transaction may take (:func:`~drill.records.urls.database_timeout`)."""

    @property
    def is_sqlite(self) -> bool:
        return self.engine.dialect.name == "sqlite"

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def bounded(self) -> Iterator[None]:
        """A transaction within :attr:`timeout` seconds in all, whatever the link does: past
        it, every socket this database's connections hold is shut down — the read blocked on a
        server that will never answer ends — and the transaction fails as the database being
        away (a :class:`DatabaseError`, transient: the drill goes on and spools its verdict).
        SQLite needs none: a lock is waited for within its busy timeout."""
        if self.engine.dialect.name != "postgresql":
            yield
            return
        fired = threading.Event()
        timer = threading.Timer(self.timeout, self._cut, (fired,))
        timer.daemon = True
        timer.start()
        try:
            yield
        except (SQLAlchemyError, OSError) as exc:
            if not fired.is_set():
                raise
            err = DatabaseError(
                f"database {safe_url(self.url)} stopped answering: no reply within {self.timeout:g} s "
                f"($DRILL_DATABASE_TIMEOUT) ({failure_reason(exc) if isinstance(exc, SQLAlchemyError) else exc})"
            )
            err.transient = True
            raise err from None
        finally:
            timer.cancel()

    def _cut(self, fired: threading.Event) -> None:
        fired.set()
        for conn in list(_CONNECTIONS.get(self.engine, ())):
            try:
                fd = os.dup(conn.pgconn.socket)
            except Exception:  # noqa: BLE001 - a connection already closed has nothing to cut
                continue
            sock = socket.socket(fileno=fd)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            finally:
                sock.close()


def _parsed(url: str) -> URL:
    """``url`` parsed, or a usage error: sqlalchemy raises ``ValueError`` as well as its own
    ``ArgumentError`` for what it cannot parse (``postgresql://[::1``, a port that is no number)."""
    try:
        return make_url(url)
    except (ArgumentError, ValueError):
        raise UsageError(
            f"--db {safe_url(url)!r} is not a database URL (expected sqlite:///PATH or postgresql://…)"
        ) from None


def _make_engine(url: str, *, readonly: bool = False) -> Engine:
    parsed = _parsed(url)
    kwargs: dict = {}
    if parsed.get_backend_name() == "sqlite":
        _sqlite_directory(parsed.database)
        # The scheduler and a hand-run drill may write at once: wait for the lock, don't fail.
        kwargs["connect_args"] = {"timeout": sqlite_busy_timeout()}
        if readonly and parsed.database and parsed.database != ":memory:":
            target = Path(parsed.database).resolve().as_uri()
            kwargs["creator"] = lambda: _read_only(target)
    elif parsed.get_backend_name() == "postgresql":
        kwargs["connect_args"] = postgresql_bounds(database_timeout(), dict(parsed.query))
    try:
        engine = create_engine(parsed, pool_pre_ping=True, json_serializer=_record_json, **kwargs)
    except (ArgumentError, ImportError, SQLAlchemyError) as exc:
        raise DatabaseError(f"cannot use database {safe_url(url)}: {failure_reason(exc)}") from None
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", sqlite_pragmas)
    elif engine.dialect.name == "postgresql":
        _track_connections(engine)
    return engine


def _record_json(value: Any) -> str:
    """JSON columns as every backend takes them (see :func:`drill.findings.jsonable`)."""
    import json

    from drill.findings import jsonable

    return json.dumps(jsonable(value))


def _read_only(target: str) -> sqlite3.Connection:
    """A read-only connection; on read-only media (where not even WAL's shared-memory file can
    be made) the file is opened as immutable, which reads it without any lock."""
    conn = sqlite3.connect(f"{target}?mode=ro", uri=True, timeout=sqlite_busy_timeout(), check_same_thread=False)
    try:
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        return conn
    except sqlite3.OperationalError:
        conn.close()
        return sqlite3.connect(f"{target}?immutable=1", uri=True, check_same_thread=False)


def _sqlite_directory(database: str | None) -> None:
    """The embedded default's directory is created on first use (owner only); any other must
    exist. A new database file is created readable and writable by its owner only (SQLite
    gives its WAL and shared-memory files the same permissions)."""
    if not database or database == ":memory:":
        return
    parent = Path(database).parent
    if not parent.is_dir():
        _refuse_missing_directory(database)
        try:
            parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:  # $XDG_DATA_HOME (or HOME) somewhere nothing can be created
            raise DatabaseError(
                f"cannot create the default database's directory {parent}: {exc.strerror or exc}"
                " (set $XDG_DATA_HOME, $DRILL_DATABASE_URL or --db)"
            ) from None
    try:
        os.close(os.open(database, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
    except OSError:
        pass  # read-only media: opening it will say so


def _refuse_missing_directory(database: str) -> None:
    """An SQLite file named in a directory that does not exist is a mistyped ``--db`` — nothing
    was ever recorded there, and nothing will be: refused, for reading as for writing. Only the
    embedded default's directory is drill's to create."""
    path = Path(database)
    if path != default_database_path() and not path.parent.is_dir():
        raise UsageError(f"--db {database}: directory {path.parent} does not exist (create it first)")


def upgrade(url: str) -> tuple[str | None, str]:
    """Migrate the database at ``url`` to head; returns (revision before, revision after)."""
    from alembic import command

    from drill.interrupts import held_off

    engine = _make_engine(url)
    try:
        before, tables = _stamp_and_tables(engine)  # first use of an SQLite file holds its migrate lock here
        if before is None and tables:
            raise _unstamped(engine)
        if before is not None and before not in _known_revisions():
            raise DatabaseError(_newer(url, before, head_revision()))
        with held_off(), engine.begin() as conn:  # a signal mid-migration would leave a schema half made
            command.upgrade(alembic_config(conn), "head")
        return before, head_revision()
    except SQLAlchemyError as exc:
        raise DatabaseError(f"cannot upgrade database {safe_url(url)}: {failure_reason(exc)}") from None
    finally:
        engine.dispose()


def _upgrade_once(url: str, database: str | None) -> None:
    """Upgrade an SQLite file in place, one process at a time: drills started together on a
    fresh file would otherwise all run the migrations, and all but one fail. Under the lock the
    revision is read again — another process may have upgraded it meanwhile."""
    if not database or database == ":memory:":
        upgrade(url)
        return
    with _migrate_lock(database):
        engine = _make_engine(url)
        try:
            current = _stamp_and_tables(engine)[0]
        except SQLAlchemyError as exc:
            raise DatabaseError(f"cannot reach database {safe_url(url)}: {failure_reason(exc)}") from None
        finally:
            engine.dispose()
        if current != head_revision():
            upgrade(url)


def _connectable_revision(engine: Engine, url: str) -> str | None:
    try:
        return _current_revision(engine)
    except SQLAlchemyError as exc:
        raise DatabaseError(f"cannot reach database {safe_url(url)}: {failure_reason(exc)}") from None


def open_database(url: str | None = None) -> Database:
    """Connect and make sure the schema is at head (upgrading an SQLite file in place)."""
    url = resolve_url(url)
    engine = _make_engine(url)
    current = _connectable_revision(engine, url)
    head = head_revision()
    if current != head:
        if current is not None and current not in _known_revisions():
            engine.dispose()
            raise DatabaseError(_newer(url, current, head))
        if engine.dialect.name == "sqlite":
            _upgrade_once(url, engine.url.database)
        else:
            engine.dispose()
            have = f"at revision {current}" if current else "empty (no drill schema)"
            raise DatabaseError(
                f"database {safe_url(url)} is {have}; this drill needs {head}: "
                f"run `drill db upgrade --db URL` once (an operator's step for a shared database)"
            )
    return Database(url=url, engine=engine, sessions=sessionmaker(engine, expire_on_commit=False))


def read_database(url: str | None = None) -> Database | None:
    """Open for reading only: no migration, no write (read-only SQLite files work), and
    None when the embedded SQLite file does not exist yet (nothing was ever recorded)."""
    url = resolve_url(url)
    parsed = _parsed(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        if not Path(parsed.database).exists():
            _refuse_missing_directory(parsed.database)
            return None  # nothing recorded there yet
    engine = _make_engine(url, readonly=True)
    current = _connectable_revision(engine, url)
    head = head_revision()
    if current == head:
        return Database(url=url, engine=engine, sessions=sessionmaker(engine, expire_on_commit=False))
    engine.dispose()
    if current is None:
        return (
            None
            if parsed.get_backend_name() == "sqlite"
            else _raise(
                DatabaseError(f"database {safe_url(url)} holds no drill schema: run `drill db upgrade --db URL` once")
            )
        )
    if current not in _known_revisions():
        raise DatabaseError(_newer(url, current, head))
    if parsed.get_backend_name() == "sqlite":  # a drill that writes will upgrade it; reading needs the new schema now
        return open_database(url)
    raise DatabaseError(
        f"database {safe_url(url)} is at revision {current}; this drill needs {head}: run `drill db upgrade --db URL` once"
    )


def _raise(exc: Exception) -> Database:
    raise exc


def _newer(url: str, current: str, head: str) -> str:
    return (
        f"database {safe_url(url)} has schema revision {current}, newer than this drill knows (head {head}): "
        "this drill is older than the database; install the drill version that upgraded it"
    )


@dataclass(frozen=True, slots=True)
class SchemaStatus:
    url: str
    current: str | None
    head: str
    tables: tuple[str, ...]

    @property
    def state(self) -> str:
        """``current``, ``behind`` (run ``drill db upgrade``) or ``ahead`` (this drill is older)."""
        if self.current == self.head:
            return "current"
        return "ahead" if self.current is not None and self.current not in _known_revisions() else "behind"


def schema_status(url: str | None = None) -> SchemaStatus:
    """The database's revision next to the head this drill ships."""
    url = resolve_url(url)
    engine = _make_engine(url)
    try:
        current = _connectable_revision(engine, url)
        tables = tuple(sorted(inspect(engine).get_table_names()))
    except SQLAlchemyError as exc:
        raise DatabaseError(f"cannot reach database {safe_url(url)}: {failure_reason(exc)}") from None
    finally:
        engine.dispose()
    return SchemaStatus(safe_url(url), current, head_revision(), tables)


def _known_revisions() -> set[str]:
    from alembic.script import ScriptDirectory

    return {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def failure_reason(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    return text[0] if text else type(orig).__name__
