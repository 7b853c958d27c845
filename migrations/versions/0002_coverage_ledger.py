"""coverage ledger: when each file of a checkpoint was last verified, and its digest

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "file_verifications",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("checkpoint_id", sa.Integer(), sa.ForeignKey("checkpoints.id", ondelete="CASCADE"), nullable=False),
        sa.Column("path", sa.String(1024), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("xxh3_128", sa.String(32), nullable=False),
        sa.Column("verified_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("drill_id", sa.Integer(), sa.ForeignKey("drills.id", ondelete="SET NULL")),
        sa.UniqueConstraint("checkpoint_id", "path", name="uq_file_verifications_checkpoint_path"),
    )
    op.add_column("drills", sa.Column("sample", sa.String(64)))
    op.add_column("drills", sa.Column("evidence_level", sa.String(16)))


def downgrade() -> None:
    with op.batch_alter_table("drills") as batch:
        batch.drop_column("evidence_level")
        batch.drop_column("sample")
    op.drop_table("file_verifications")
