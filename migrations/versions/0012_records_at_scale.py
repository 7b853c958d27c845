"""records at scale: the verified audit head (audit_verified) and indexes for the queries
reports and metrics make (each run's drills by time, each checkpoint's latest drill, each source's
latest drill and counts by verdict)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_verified",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("drill_id", sa.Integer(), nullable=False),
        sa.Column("sealed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("drills_through", sa.Integer(), nullable=False),
        sa.Column("verified_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("full", sa.Boolean(), nullable=False),
        sa.Column("mac", sa.String(64)),
    )
    op.create_index("ix_drills_run_root_started_at", "drills", ["run_root", "started_at"])
    op.create_index("ix_drills_checkpoint_id_id", "drills", ["checkpoint_id", "id"])
    op.create_index("ix_drills_source_status", "drills", ["policy", "run_root", "status"])
    op.create_index("ix_checkpoints_run_root_last_seen", "checkpoints", ["run_root", "last_seen"])


def downgrade() -> None:
    op.drop_index("ix_checkpoints_run_root_last_seen", table_name="checkpoints")
    op.drop_index("ix_drills_source_status", table_name="drills")
    op.drop_index("ix_drills_checkpoint_id_id", table_name="drills")
    op.drop_index("ix_drills_run_root_started_at", table_name="drills")
    op.drop_table("audit_verified")
