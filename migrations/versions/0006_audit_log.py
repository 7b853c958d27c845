"""the tamper-evident drill log: each closed drill record sealed into a hash chain

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("seq", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("drill_id", sa.Integer(), nullable=False),
        sa.Column("content_sha256", sa.String(64), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("mac", sa.String(64)),
        sa.Column("key_id", sa.String(16)),
        sa.Column("sealed_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("hash", name="uq_audit_log_hash"),
    )
    op.create_index("ix_audit_log_drill_id", "audit_log", ["drill_id"])


def downgrade() -> None:
    op.drop_index("ix_audit_log_drill_id", table_name="audit_log")
    op.drop_table("audit_log")
