"""restore bursts: N readers restoring one checkpoint at once, swept (bursts)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

JSON_DOCUMENT = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "bursts",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_root", sa.Text(), nullable=False),
        sa.Column("checkpoint_uri", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("cold", sa.Boolean(), nullable=False),
        sa.Column("replicated", sa.Boolean(), nullable=False),
        sa.Column("max_readers", sa.Integer(), nullable=False),
        sa.Column("ceiling_bps", sa.Float()),
        sa.Column("ceiling_readers", sa.Integer()),
        sa.Column("document", JSON_DOCUMENT, nullable=False),
        sa.Column("drill_version", sa.String(64), nullable=False),
    )
    op.create_index("ix_bursts_run_root", "bursts", ["run_root"])
    op.create_index("ix_bursts_started_at", "bursts", ["started_at"])


def downgrade() -> None:
    op.drop_index("ix_bursts_started_at", table_name="bursts")
    op.drop_index("ix_bursts_run_root", table_name="bursts")
    op.drop_table("bursts")
