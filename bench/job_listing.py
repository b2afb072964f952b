"""What one page of `GET /v1/jobs` costs the database as the jobs table grows, with and
without the index on submission order (migration 0009, issue #36).

For each size it makes a SQLite database migrated to 0008 (no index) and to the head,
fills the jobs table with that many rows (a 10,000-task array's rows look the same),
and times the page query the route makes: `ORDER BY submit_seq, id LIMIT 20`, and its
`count(*)`. It prints the median of `--repeat` runs, in ms, and the ratio.

  python bench/job_listing.py [--sizes 1500,11500,100000] [--repeat 50]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from sqlalchemy import func, insert, select

from gpuloom.store.migrate import upgrade
from gpuloom.store.models import JobRow
from gpuloom.store.rows import job_row
from gpuloom.store.session import make_engine
from gpuloom.testing.builders import LogBuilder


def template() -> dict[str, object]:
    """The row the read-model writer makes for one queued task (`gpuloom.store.rows`)."""
    log = LogBuilder()
    log.submit("task", gpus=1)
    return job_row(log.state().jobs["task"])


def row(base: dict[str, object], index: int) -> dict[str, object]:
    return {**base, "id": f"job-{index:08d}", "user": f"user-{index % 7}", "submit_seq": index + 1}


async def page_ms(url: str, revision: str, size: int, repeat: int) -> tuple[float, float]:
    await upgrade(url, revision)
    engine = make_engine(url)
    base = template()
    try:
        async with engine.begin() as conn:
            for start in range(0, size, 5000):
                await conn.execute(
                    insert(JobRow), [row(base, i) for i in range(start, min(size, start + 5000))]
                )
        page, count = [], []
        query = select(JobRow).order_by(JobRow.submit_seq, JobRow.id).limit(20)
        async with engine.connect() as conn:
            for _ in range(repeat):
                started = time.perf_counter()
                rows = (await conn.execute(query)).all()
                page.append((time.perf_counter() - started) * 1000)
                assert len(rows) == min(20, size)
                started = time.perf_counter()
                await conn.scalar(select(func.count()).select_from(select(JobRow).subquery()))
                count.append((time.perf_counter() - started) * 1000)
        return statistics.median(page), statistics.median(count)
    finally:
        await engine.dispose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1500,11500,100000")
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    print(f"{'rows':>8} {'page, no index':>15} {'page, index':>12} {'ratio':>7} {'count(*)':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            before, _ = await page_ms(
                f"sqlite+aiosqlite:///{Path(tmp)}/before-{size}.db", "0008", size, args.repeat
            )
            after, count = await page_ms(
                f"sqlite+aiosqlite:///{Path(tmp)}/after-{size}.db", "head", size, args.repeat
            )
            print(
                f"{size:>8} {before:>12.3f} ms {after:>9.3f} ms {before / after:>6.1f}x "
                f"{count:>6.3f} ms",
                flush=True,
            )


if __name__ == "__main__":
    asyncio.run(main())
