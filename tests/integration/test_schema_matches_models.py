"""The migrations make exactly the schema the models declare: alembic's autogenerate
compares the migrated database with the metadata, and any difference (a column, an
index such as the job listing's, a type) is a failure naming it. SQLite, and
PostgreSQL when GPULOOM_TEST_DATABASE_URL is set."""

from __future__ import annotations

from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Index, MetaData, Table
from sqlalchemy.engine import Connection

from gpuloom.store.migrate import upgrade
from gpuloom.store.models import Base, JobRow
from gpuloom.store.session import make_engine

pytestmark = pytest.mark.integration


async def differences(url: str, metadata: MetaData) -> list[Any]:
    await upgrade(url)
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:

            def compare(sync_conn: Connection) -> list[Any]:
                context = MigrationContext.configure(
                    sync_conn, opts={"compare_type": True, "compare_server_default": False}
                )
                return [
                    diff
                    for diff in compare_metadata(context, metadata)
                    if not (diff[0] == "remove_table" and diff[1].name == "alembic_version")
                ]

            return await conn.run_sync(compare)
    finally:
        await engine.dispose()


async def test_the_migrated_schema_is_the_models(database_url: str) -> None:
    assert await differences(database_url, Base.metadata) == []


async def test_a_missing_index_is_found(database_url: str) -> None:
    """The comparison can fail: models that declare one more index than the migrations
    make differ by exactly that index."""
    metadata = MetaData()
    for table in Base.metadata.sorted_tables:
        table.to_metadata(metadata)
    jobs: Table = metadata.tables[JobRow.__tablename__]
    Index("ix_jobs_name_only_in_this_test", jobs.c.name)
    found = await differences(database_url, metadata)
    assert [(diff[0], diff[1].name) for diff in found] == [
        ("add_index", "ix_jobs_name_only_in_this_test")
    ]
