"""checkpoints sealed at save: what each seal cost (saves)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "saves",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("checkpoint_uri", sa.Text(), nullable=False),
        sa.Column("run_root", sa.Text(), nullable=False),
        sa.Column("step", sa.Integer()),
        sa.Column("method", sa.String(16), nullable=False),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("hash_seconds", sa.Float(), nullable=False),
        sa.Column("save_seconds", sa.Float(), nullable=False),
        sa.Column("bytes_read_back", sa.BigInteger(), nullable=False),
        sa.Column("keyed", sa.Boolean(), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("saved_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("drill_version", sa.String(64), nullable=False),
        sa.UniqueConstraint("host", "pid", "saved_at", "checkpoint_uri", name="uq_saves_origin"),
    )
    op.create_index("ix_saves_run_root", "saves", ["run_root"])
    op.create_index("ix_saves_checkpoint_uri", "saves", ["checkpoint_uri"])


def downgrade() -> None:
    op.drop_index("ix_saves_checkpoint_uri", table_name="saves")
    op.drop_index("ix_saves_run_root", table_name="saves")
    op.drop_table("saves")
