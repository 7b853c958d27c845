"""policies and the scheduler: policy and selection on drills, SLO breaches, alerts, the
scheduler's lease and heartbeat, and APScheduler's job store

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

JSON_DOCUMENT = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.add_column("drills", sa.Column("policy", sa.String(255)))
    op.add_column("drills", sa.Column("selection", sa.Text()))
    op.add_column("drills", sa.Column("slo_breaches", JSON_DOCUMENT))
    op.create_index("ix_drills_policy", "drills", ["policy"])
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("drill_id", sa.Integer(), sa.ForeignKey("drills.id", ondelete="CASCADE"), nullable=False),
        sa.Column("channel", sa.String(16), nullable=False),
        sa.Column("target", sa.String(512), nullable=False),
        sa.Column("delivered", sa.Boolean(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text()),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_alerts_drill_id", "alerts", ["drill_id"])
    op.create_table(
        "scheduler_lease",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("policies", JSON_DOCUMENT),
    )
    # APScheduler 3.x's SQLAlchemyJobStore table, created here so that the schema has one owner.
    op.create_table(
        "apscheduler_jobs",
        sa.Column("id", sa.Unicode(191), primary_key=True),
        sa.Column("next_run_time", sa.Float(25), index=True),
        sa.Column("job_state", sa.LargeBinary(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("apscheduler_jobs")
    op.drop_table("scheduler_lease")
    op.drop_table("alerts")
    op.drop_index("ix_drills_policy", "drills")
    with op.batch_alter_table("drills") as batch:
        batch.drop_column("slo_breaches")
        batch.drop_column("selection")
        batch.drop_column("policy")
