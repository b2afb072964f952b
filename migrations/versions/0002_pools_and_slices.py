"""pools, fractions and replicas: the job's resource request and placement, node features

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03 03:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("request", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("placement", sa.JSON(), nullable=True))
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(
            sa.Column("lends_remote_vgpu", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(
            sa.Column("isolation", sa.String(length=20), nullable=False, server_default="advisory")
        )


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("isolation")
        batch.drop_column("lends_remote_vgpu")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("placement")
        batch.drop_column("request")
