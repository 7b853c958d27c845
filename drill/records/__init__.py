"""The record of every drill: SQLAlchemy models, the database, and the store that writes it.

The schema exists only through the Alembic migrations in ``migrations/``.
"""
