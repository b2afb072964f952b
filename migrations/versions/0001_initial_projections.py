"""initial projections

Revision ID: 0001
Revises:
Create Date: 2026-12-02 21:39:55.877064
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("user", sa.String(length=100), nullable=False),
        sa.Column("account", sa.String(length=100), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("reason", sa.String(length=2000), nullable=True),
        sa.Column("node", sa.String(length=64), nullable=True),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.Column("gpus_requested", sa.Integer(), nullable=False),
        sa.Column("gpu_model", sa.JSON(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("command", sa.JSON(), nullable=False),
        sa.Column("time_limit_s", sa.Integer(), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("submit_seq", sa.BigInteger(), nullable=False),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_jobs_account"), ["account"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_jobs_idempotency_key"), ["idempotency_key"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_jobs_state"), ["state"], unique=False)
        batch_op.create_index(batch_op.f("ix_jobs_user"), ["user"], unique=False)

    op.create_table(
        "nodes",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("simulated", sa.Boolean(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("cpu_milli", sa.Integer(), nullable=False),
        sa.Column("memory_mib", sa.BigInteger(), nullable=False),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_nodes")),
    )
    op.create_table(
        "projection_checkpoints",
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_projection_checkpoints")),
    )
    op.create_table(
        "usage_charges",
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("user", sa.String(length=100), nullable=False),
        sa.Column("account", sa.String(length=100), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("gpu_milli_seconds", sa.BigInteger(), nullable=False),
        sa.Column("charged_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "attempt", name=op.f("pk_usage_charges")),
    )
    with op.batch_alter_table("usage_charges", schema=None) as batch_op:
        batch_op.create_index("ix_usage_charges_account_user", ["account", "user"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("usage_charges", schema=None) as batch_op:
        batch_op.drop_index("ix_usage_charges_account_user")

    op.drop_table("usage_charges")
    op.drop_table("projection_checkpoints")
    op.drop_table("nodes")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_user"))
        batch_op.drop_index(batch_op.f("ix_jobs_state"))
        batch_op.drop_index(batch_op.f("ix_jobs_idempotency_key"))
        batch_op.drop_index(batch_op.f("ix_jobs_account"))

    op.drop_table("jobs")
