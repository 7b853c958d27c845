"""an audit that never overstates: who closed each sealed record and what it supersedes; how
each drill was asked for (its options), so a re-run repeats it exactly; scheduled drills that
did not run (scheduler_events)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

JSON_DOCUMENT = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("drills") as batch:
        batch.add_column(sa.Column("options", JSON_DOCUMENT))
    op.create_table(
        "scheduler_events",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("policy", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("scheduled_for", sa.DateTime(timezone=True)),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("exit_code", sa.Integer()),
        sa.Column("holder", sa.String(255)),
    )
    op.create_index("ix_scheduler_events_policy", "scheduler_events", ["policy"])
    op.create_index("ix_scheduler_events_at", "scheduler_events", ["at"])
    with op.batch_alter_table("audit_log") as batch:
        batch.add_column(sa.Column("closed_by", sa.String(32)))
        batch.add_column(sa.Column("supersedes", sa.BigInteger()))


def downgrade() -> None:
    with op.batch_alter_table("audit_log") as batch:
        batch.drop_column("supersedes")
        batch.drop_column("closed_by")
    with op.batch_alter_table("drills") as batch:
        batch.drop_column("options")
    op.drop_index("ix_scheduler_events_at", "scheduler_events")
    op.drop_index("ix_scheduler_events_policy", "scheduler_events")
    op.drop_table("scheduler_events")
