"""Alembic environment for drill's record database.

drill runs migrations programmatically (``drill db upgrade``, and the embedded SQLite on first
use), handing its own connection in ``config.attributes["connection"]``. Developers may also
run ``alembic -c alembic.ini …`` with ``DRILL_DATABASE_URL`` set.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from drill.failpoints import failpoint
from drill.records.db import resolve_url
from drill.records.models import Base

target_metadata = Base.metadata


def run_migrations(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds tables instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        on_version_apply=lambda **_: failpoint("migrated"),  # tests: a signal between two revisions
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        run_migrations(connection)
        return
    engine = create_engine(resolve_url(context.config.get_main_option("sqlalchemy.url") or None))
    with engine.begin() as conn:
        run_migrations(conn)
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("drill's migrations run online only: use `drill db upgrade`")
run_online()
