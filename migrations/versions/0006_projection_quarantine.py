"""projection quarantine: rows a projection's database refused, kept so it goes on

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "projection_quarantine",
        sa.Column("projection", sa.String(length=100), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("error", sa.String(length=1000), nullable=False),
        sa.Column("row", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("projection", "kind", "key", name=op.f("pk_projection_quarantine")),
    )


def downgrade() -> None:
    op.drop_table("projection_quarantine")
