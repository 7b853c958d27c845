"""cold or warm restores: how much of the checkpoint the host had cached (drills.page_cache)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

JSON_DOCUMENT = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("drills") as batch:
        batch.add_column(sa.Column("page_cache", JSON_DOCUMENT))


def downgrade() -> None:
    with op.batch_alter_table("drills") as batch:
        batch.drop_column("page_cache")
