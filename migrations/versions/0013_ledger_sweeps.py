"""ledger sweeps: a checkpoint's proofs re-dated at once (proofs_verified_at) and the
fingerprint of the proofs stored (proofs_fingerprint), so a nightly verification of an unchanged
checkpoint of 20,000 files neither reads nor rewrites 20,000 ledger rows

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("checkpoints", sa.Column("proofs_verified_at", sa.DateTime(timezone=True)))
    op.add_column("checkpoints", sa.Column("proofs_fingerprint", sa.String(32)))


def downgrade() -> None:
    # The sweep's time written back into each row it covers: no proof gets older.
    op.execute(
        "UPDATE file_verifications SET verified_at = (SELECT c.proofs_verified_at FROM checkpoints c "
        "WHERE c.id = file_verifications.checkpoint_id) WHERE EXISTS (SELECT 1 FROM checkpoints c "
        "WHERE c.id = file_verifications.checkpoint_id AND c.proofs_verified_at > file_verifications.verified_at)"
    )
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_column("proofs_fingerprint")
        batch.drop_column("proofs_verified_at")
