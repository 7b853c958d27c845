"""an audit that never overstates: who closed each sealed record and what it supersedes; how
each drill was asked for (its options), so a re-run repeats it exactly

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

JSON_DOCUMENT = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("drills") as batch:
        batch.add_column(sa.Column("options", JSON_DOCUMENT))
    with op.batch_alter_table("audit_log") as batch:
        batch.add_column(sa.Column("closed_by", sa.String(32)))
        batch.add_column(sa.Column("supersedes", sa.BigInteger()))


def downgrade() -> None:
    with op.batch_alter_table("audit_log") as batch:
        batch.drop_column("supersedes")
        batch.drop_column("closed_by")
    with op.batch_alter_table("drills") as batch:
        batch.drop_column("options")
