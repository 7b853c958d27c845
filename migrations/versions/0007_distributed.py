"""distributed drills: per-rank figures on the drill, and the batch job that ran it

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

JSON_DOCUMENT = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("drills") as batch:
        batch.add_column(sa.Column("distributed", JSON_DOCUMENT))
        batch.add_column(sa.Column("job_id", sa.String(128)))
        batch.create_index("ix_drills_job_id", ["job_id"])


def downgrade() -> None:
    with op.batch_alter_table("drills") as batch:
        batch.drop_index("ix_drills_job_id")
        batch.drop_column("job_id")
        batch.drop_column("distributed")
