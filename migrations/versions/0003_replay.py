"""replay: time to first step, the replay verdict, and every replayed step's values

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("drills", sa.Column("ttfs_seconds", sa.Float()))
    op.add_column("drills", sa.Column("replay_verdict", sa.String(32)))
    op.create_table(
        "replay_steps",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("drill_id", sa.Integer(), sa.ForeignKey("drills.id", ondelete="CASCADE"), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("reference_loss", sa.Float()),
        sa.Column("loss", sa.Float(), nullable=False),
        sa.Column("reference_grad_norm", sa.Float()),
        sa.Column("grad_norm", sa.Float()),
        sa.Column("reference_batch", sa.String(64)),
        sa.Column("batch", sa.String(64)),
        sa.Column("matches", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_replay_steps_drill_id", "replay_steps", ["drill_id"])


def downgrade() -> None:
    op.drop_table("replay_steps")
    with op.batch_alter_table("drills") as batch:
        batch.drop_column("replay_verdict")
        batch.drop_column("ttfs_seconds")
