"""periodic charges: a run may be charged in several parts (job_id, attempt, part)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03 05:50:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CHARGE_COLUMNS = ["job_id", "attempt", "user", "account", "gpus", "seconds", "gpu_milli_seconds"]
MODEL_COLUMNS = ["job_id", "attempt", "gpu_model", "user", "account", "gpu_milli_seconds"]


def _charges(name: str, with_part: bool) -> None:
    key = ["job_id", "attempt", "part"] if with_part else ["job_id", "attempt"]
    op.create_table(
        name,
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        *([sa.Column("part", sa.Integer(), nullable=False)] if with_part else []),
        sa.Column("user", sa.String(length=100), nullable=False),
        sa.Column("account", sa.String(length=100), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("gpu_milli_seconds", sa.BigInteger(), nullable=False),
        sa.Column("charged_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(*key, name=f"pk_{name}_{'parts' if with_part else 'runs'}"),
    )


def _model_charges(name: str, with_part: bool) -> None:
    key = (
        ["job_id", "attempt", "part", "gpu_model"]
        if with_part
        else ["job_id", "attempt", "gpu_model"]
    )
    op.create_table(
        name,
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        *([sa.Column("part", sa.Integer(), nullable=False)] if with_part else []),
        sa.Column("gpu_model", sa.String(length=100), nullable=False),
        sa.Column("user", sa.String(length=100), nullable=False),
        sa.Column("account", sa.String(length=100), nullable=False),
        sa.Column("gpu_milli_seconds", sa.BigInteger(), nullable=False),
        sa.Column("charged_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(*key, name=f"pk_{name}_{'parts' if with_part else 'runs'}"),
    )


def _move(table: str, columns: list[str], build: object, with_part: bool) -> None:
    """Rebuild `table` with (or without) the part column, keeping its rows."""
    old = f"{table}_before_0004"
    op.rename_table(table, old)
    build(table, with_part)  # type: ignore[operator]
    names = ", ".join(f'"{c}"' for c in [*columns, "charged_at", "seq"])  # "user" is reserved
    if with_part:
        op.execute(f"INSERT INTO {table} ({names}, part) SELECT {names}, 0 FROM {old}")
    else:
        op.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM {old} WHERE part = 0")
    op.drop_table(old)


def upgrade() -> None:
    op.drop_index("ix_usage_charges_account_user", table_name="usage_charges")
    op.drop_index("ix_usage_model_charges_model", table_name="usage_model_charges")
    _move("usage_charges", CHARGE_COLUMNS, _charges, True)
    _move("usage_model_charges", MODEL_COLUMNS, _model_charges, True)
    op.create_index("ix_usage_charges_account_user", "usage_charges", ["account", "user"])
    op.create_index("ix_usage_model_charges_model", "usage_model_charges", ["gpu_model"])


def downgrade() -> None:
    op.drop_index("ix_usage_charges_account_user", table_name="usage_charges")
    op.drop_index("ix_usage_model_charges_model", table_name="usage_model_charges")
    _move("usage_charges", CHARGE_COLUMNS, _charges, False)
    _move("usage_model_charges", MODEL_COLUMNS, _model_charges, False)
    op.create_index("ix_usage_charges_account_user", "usage_charges", ["account", "user"])
    op.create_index("ix_usage_model_charges_model", "usage_model_charges", ["gpu_model"])
