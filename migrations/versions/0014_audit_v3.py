"""audit log v3: each entry says how its record's content was digested (version; NULL for the
entries of drill 0.5 and earlier), and every pass of drill audit verify is recorded, intact or
not (audit_verified.intact, .problems): what the metrics report without verifying on a scrape

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("audit_log", sa.Column("version", sa.SmallInteger()))
    op.add_column("audit_verified", sa.Column("intact", sa.Boolean(), nullable=False, server_default=sa.true()))
    op.add_column("audit_verified", sa.Column("problems", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("audit_verified") as batch:
        batch.drop_column("problems")
        batch.drop_column("intact")
    with op.batch_alter_table("audit_log") as batch:
        batch.drop_column("version")
