"""Run the alembic migrations of the projections (`python -m gpuloom.store.migrate`)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Connection

from gpuloom.config import load_settings
from gpuloom.store.session import make_engine


def migrations_dir() -> Path:
    """`migrations/` of the repository (or GPULOOM_MIGRATIONS_DIR in an installed image)."""
    configured = os.environ.get("GPULOOM_MIGRATIONS_DIR")
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[3] / "migrations"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("sqlalchemy.url", url)
    return cfg


async def upgrade(url: str, revision: str = "head") -> None:
    """Upgrade the database at `url` to `revision` on one connection, from async code."""
    engine = make_engine(url)
    cfg = alembic_config(url)
    try:
        async with engine.begin() as conn:

            def _run(sync_conn: Connection) -> None:
                cfg.attributes["connection"] = sync_conn
                command.upgrade(cfg, revision)

            await conn.run_sync(_run)
    finally:
        await engine.dispose()


async def downgrade(url: str, revision: str = "base") -> None:
    engine = make_engine(url)
    cfg = alembic_config(url)
    try:
        async with engine.begin() as conn:

            def _run(sync_conn: Connection) -> None:
                cfg.attributes["connection"] = sync_conn
                command.downgrade(cfg, revision)

            await conn.run_sync(_run)
    finally:
        await engine.dispose()


def main() -> None:
    url = load_settings().database_url
    asyncio.run(upgrade(url))
    print(f"migrated {url.split('@')[-1]}", file=sys.stderr)


if __name__ == "__main__":
    main()
