"""one outcome document: exit code, message and every phase on the drill; the process start
time (so orphan recovery never mistakes a reused pid for the drill's); non-finite replay
values stored, never rejected

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

JSON_DOCUMENT = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("drills") as batch:
        batch.add_column(sa.Column("exit_code", sa.Integer()))
        batch.add_column(sa.Column("message", sa.Text()))
        batch.add_column(sa.Column("plan_seconds", sa.Float()))
        batch.add_column(sa.Column("replay_seconds", sa.Float()))
        batch.add_column(sa.Column("replay_reason", sa.Text()))
        batch.add_column(sa.Column("process_start", sa.BigInteger()))
    with op.batch_alter_table("replay_steps") as batch:
        batch.alter_column("loss", existing_type=sa.Float(), nullable=True)
        batch.add_column(sa.Column("nonfinite", JSON_DOCUMENT))


def downgrade() -> None:
    with op.batch_alter_table("replay_steps") as batch:
        batch.drop_column("nonfinite")
        batch.alter_column("loss", existing_type=sa.Float(), nullable=False)
    with op.batch_alter_table("drills") as batch:
        for column in ("process_start", "replay_reason", "replay_seconds", "plan_seconds", "message", "exit_code"):
            batch.drop_column(column)
