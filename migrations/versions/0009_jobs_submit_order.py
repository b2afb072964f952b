"""jobs listed in submission order without sorting the table

`GET /v1/jobs` pages through jobs by (submit_seq, id). Without an index each page
scanned and sorted the whole table: with 11,500 rows, 3.7 ms of SQLite's time for 20
rows, so one user's 10,000-task array made every other user's listing 4 times slower
(issue #36). With it, a page reads its rows in order and stops.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06 19:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_jobs_submit_order", "jobs", ["submit_seq", "id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_submit_order", table_name="jobs")
