"""Fixtures shared by every test layer."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuloom.testing.servers import fresh_postgres_database

DATABASE_KINDS = ["sqlite"] + (
    ["postgresql"] if os.environ.get("GPULOOM_TEST_DATABASE_URL") else []
)


@pytest.fixture(params=DATABASE_KINDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database: a SQLite file, and PostgreSQL when GPULOOM_TEST_DATABASE_URL is set."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path}/gpuloom.db"
        return
    with fresh_postgres_database(os.environ["GPULOOM_TEST_DATABASE_URL"]) as url:
        yield url
