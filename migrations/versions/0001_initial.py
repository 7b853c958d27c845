"""initial schema: checkpoints, drills, check results

Revision ID: 0001
Revises:
Create Date: 2026-11-30

Migrations spell out column types instead of importing drill's models, so that a later change
to a model can never rewrite history.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

UTC_DATETIME = sa.DateTime(timezone=True)
JSON_DOCUMENT = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_root", sa.String(2048), nullable=False),
        sa.Column("uri", sa.String(2048), nullable=False, unique=True),
        sa.Column("step", sa.BigInteger()),
        sa.Column("format", sa.String(32), nullable=False),
        sa.Column("bytes", sa.BigInteger()),
        sa.Column("file_count", sa.Integer()),
        sa.Column("first_seen", UTC_DATETIME, nullable=False),
        sa.Column("last_seen", UTC_DATETIME, nullable=False),
    )
    op.create_index("ix_checkpoints_run_root", "checkpoints", ["run_root"])

    op.create_table(
        "drills",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("checkpoint_id", sa.Integer(), sa.ForeignKey("checkpoints.id")),
        sa.Column("run_root", sa.String(2048), nullable=False),
        sa.Column("selector", sa.String(2048), nullable=False),
        sa.Column("trigger", sa.String(32), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("device", sa.String(64), nullable=False),
        sa.Column("started_at", UTC_DATETIME, nullable=False),
        sa.Column("finished_at", UTC_DATETIME),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("phase", sa.String(32), nullable=False),
        sa.Column("error", sa.Text()),
        sa.Column("restore_seconds", sa.Float()),
        sa.Column("discover_seconds", sa.Float()),
        sa.Column("read_seconds", sa.Float()),
        sa.Column("load_seconds", sa.Float()),
        sa.Column("checks_seconds", sa.Float()),
        sa.Column("bytes_read", sa.BigInteger()),
        sa.Column("throughput_bps", sa.Float()),
        sa.Column("drill_version", sa.String(32), nullable=False),
        sa.Column("torch_version", sa.String(64)),
    )
    op.create_index("ix_drills_checkpoint_id", "drills", ["checkpoint_id"])
    op.create_index("ix_drills_run_root", "drills", ["run_root"])
    op.create_index("ix_drills_started_at", "drills", ["started_at"])
    op.create_index("ix_drills_status", "drills", ["status"])

    op.create_table(
        "check_results",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("drill_id", sa.Integer(), sa.ForeignKey("drills.id", ondelete="CASCADE"), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("evidence", JSON_DOCUMENT, nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
    )
    op.create_index("ix_check_results_drill_id", "check_results", ["drill_id"])


def downgrade() -> None:
    op.drop_table("check_results")
    op.drop_table("drills")
    op.drop_table("checkpoints")
