"""records as one row: a drill's checks and replayed steps as one document on its row
(drills.details; check_results and replay_steps keep the drills recorded before), a check's
large evidence stored once by its content (documents); audit log v3:
each entry says how its record's content was digested (version; NULL for the entries of drill
0.5 and earlier), and every pass of drill audit verify is recorded, intact or not
(audit_verified.intact, .problems): what the metrics report without verifying on a scrape

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON_DOCUMENT = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("drills", sa.Column("details", JSON_DOCUMENT))
    op.create_table(
        "documents",
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("body", sa.Text(), nullable=False),
    )
    op.add_column("audit_log", sa.Column("version", sa.SmallInteger()))
    op.add_column("audit_verified", sa.Column("intact", sa.Boolean(), nullable=False, server_default=sa.true()))
    op.add_column("audit_verified", sa.Column("problems", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("audit_verified") as batch:
        batch.drop_column("problems")
        batch.drop_column("intact")
    with op.batch_alter_table("audit_log") as batch:
        batch.drop_column("version")
    op.drop_table("documents")
    with op.batch_alter_table("drills") as batch:
        batch.drop_column("details")
