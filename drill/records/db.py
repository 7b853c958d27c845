"""Opening the record database and keeping its schema at Alembic's head.

The embedded default is an SQLite file that upgrades itself on first use. A shared
PostgreSQL database is upgraded only by ``drill db upgrade``: many hosts may point at it, and
a nightly drill must not migrate it behind an operator's back.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from drill.errors import DatabaseError, UsageError

DATABASE_ENV = "DRILL_DATABASE_URL"


def default_database_path() -> Path:
    """``$XDG_DATA_HOME/drill/drill.db``, i.e. ``~/.local/share/drill/drill.db`` by default."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "drill" / "drill.db"


def resolve_url(value: str | None = None) -> str:
    """``--db`` wins, then ``$DRILL_DATABASE_URL``, then the embedded SQLite file.

    A value without ``://`` is a path to an SQLite file; ``postgresql://`` means psycopg 3.
    """
    value = value or os.environ.get(DATABASE_ENV) or str(default_database_path())
    if "://" not in value:
        return f"sqlite:///{os.path.abspath(os.path.expanduser(value))}"
    for prefix in ("postgresql://", "postgres://"):
        if value.startswith(prefix):
            return "postgresql+psycopg://" + value[len(prefix) :]
    return value


def safe_url(url: str | URL) -> str:
    """The URL with any password masked: the only form drill ever prints or logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparseable database URL>"


def migrations_dir() -> Path:
    """``drill/_migrations`` in an installed wheel, else ``migrations/`` of the source tree."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "_migrations", here.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise DatabaseError(f"drill's migrations are missing (looked in {here / '_migrations'} and {here.parent / 'migrations'})")


def alembic_config(connection=None):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def _current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


@dataclass(slots=True)
class Database:
    url: str
    engine: Engine
    sessions: sessionmaker[Session]

    @property
    def is_sqlite(self) -> bool:
        return self.engine.dialect.name == "sqlite"

    def close(self) -> None:
        self.engine.dispose()


def _make_engine(url: str) -> Engine:
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise UsageError(f"--db {url!r} is not a database URL (expected sqlite:///PATH or postgresql://…)") from None
    kwargs: dict = {}
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        # The scheduler and a hand-run drill may write at once: wait for the lock, don't fail.
        kwargs["connect_args"] = {"timeout": 30}
    elif parsed.get_backend_name() == "postgresql":
        kwargs["connect_args"] = {"connect_timeout": 10}
    try:
        engine = create_engine(parsed, pool_pre_ping=True, **kwargs)
    except (ArgumentError, ImportError, SQLAlchemyError) as exc:
        raise DatabaseError(f"cannot use database {safe_url(url)}: {_reason(exc)}") from None
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA journal_mode=WAL")
    cur.close()


def upgrade(url: str) -> tuple[str | None, str]:
    """Migrate the database at ``url`` to head; returns (revision before, revision after)."""
    from alembic import command

    engine = _make_engine(url)
    try:
        before = _connectable_revision(engine, url)
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "head")
        return before, head_revision()
    except SQLAlchemyError as exc:
        raise DatabaseError(f"cannot upgrade database {safe_url(url)}: {_reason(exc)}") from None
    finally:
        engine.dispose()


def _connectable_revision(engine: Engine, url: str) -> str | None:
    try:
        return _current_revision(engine)
    except SQLAlchemyError as exc:
        raise DatabaseError(f"cannot reach database {safe_url(url)}: {_reason(exc)}") from None


def open_database(url: str | None = None) -> Database:
    """Connect and make sure the schema is at head (upgrading an SQLite file in place)."""
    url = resolve_url(url)
    engine = _make_engine(url)
    current = _connectable_revision(engine, url)
    head = head_revision()
    if current != head:
        known = _known_revisions()
        if current is not None and current not in known:
            engine.dispose()
            raise DatabaseError(
                f"database {safe_url(url)} has schema revision {current}, newer than this drill knows "
                f"(head {head}): upgrade drill"
            )
        if engine.dialect.name == "sqlite":
            upgrade(url)
        else:
            engine.dispose()
            have = f"at revision {current}" if current else "empty (no drill schema)"
            raise DatabaseError(
                f"database {safe_url(url)} is {have}; this drill needs {head}: "
                f"run `drill db upgrade --db URL` once (an operator's step for a shared database)"
            )
    return Database(url=url, engine=engine, sessions=sessionmaker(engine, expire_on_commit=False))


def schema_status(url: str | None = None) -> dict[str, str | None]:
    """The database's revision next to the head this drill ships."""
    url = resolve_url(url)
    engine = _make_engine(url)
    try:
        current = _connectable_revision(engine, url)
        tables = sorted(inspect(engine).get_table_names())
    except SQLAlchemyError as exc:
        raise DatabaseError(f"cannot reach database {safe_url(url)}: {_reason(exc)}") from None
    finally:
        engine.dispose()
    return {"url": safe_url(url), "current": current, "head": head_revision(), "tables": ",".join(tables)}


def _known_revisions() -> set[str]:
    from alembic.script import ScriptDirectory

    return {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def _reason(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    return text[0] if text else type(orig).__name__
