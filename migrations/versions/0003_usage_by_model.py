"""the accounting ledger split by GPU model

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03 03:45:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "usage_model_charges",
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("gpu_model", sa.String(length=100), nullable=False),
        sa.Column("user", sa.String(length=100), nullable=False),
        sa.Column("account", sa.String(length=100), nullable=False),
        sa.Column("gpu_milli_seconds", sa.BigInteger(), nullable=False),
        sa.Column("charged_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "attempt", "gpu_model"),
    )
    op.create_index("ix_usage_model_charges_model", "usage_model_charges", ["gpu_model"])


def downgrade() -> None:
    op.drop_index("ix_usage_model_charges_model", table_name="usage_model_charges")
    op.drop_table("usage_model_charges")
