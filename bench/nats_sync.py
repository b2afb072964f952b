"""What JetStream's `sync_interval` costs: publishes per second at 2m, 1s and always.

Prints, for each setting in one run (so the ratios hold on a machine whose speed
varies), acknowledged one-by-one publishes (what the gateway does per request) and
windowed async publishes (what the services do for a batch of decisions), both of
gpuloom-sized events (about 340 bytes), and each figure's ratio to the server's
default of 2 minutes.

    .venv/bin/python bench/nats_sync.py [--events 3000] [--window 500] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from gpuloom.bus import EventBus, Outgoing
from gpuloom.devstack import NatsServer

SETTINGS = ("2m", "1s", "always")
BODY = b'{"id":"01J","type":"JobQueued","v":1,"at":"2026-12-03T10:00:00+00:00",' + b"x" * 270 + b"}"


async def rates(url: str, events: int, window: int) -> tuple[float, float]:
    bus = await EventBus.connect(url, "GPULOOM", name="bench-sync")
    try:
        started = time.perf_counter()
        for i in range(events):
            await bus.publish(Outgoing(f"gpuloom.evt.job.j{i % 1000}.JobQueued", BODY, {}))
        one_by_one = events / (time.perf_counter() - started)
        started = time.perf_counter()
        for first in range(0, events, window):
            batch = [
                Outgoing(f"gpuloom.evt.job.j{i % 1000}.JobQueued", BODY, {})
                for i in range(first, min(first + window, events))
            ]
            await bus.publish_many(batch, timeout=60)
        windowed = events / (time.perf_counter() - started)
        return one_by_one, windowed
    finally:
        await bus.close()


def measure(sync: str, events: int, window: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(Path(tmp) / "nats", sync=sync).start()
        try:
            return asyncio.run(rates(server.url, events, window))
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--window", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians")
    args = parser.parse_args()
    samples: dict[str, list[tuple[float, float]]] = {sync: [] for sync in SETTINGS}
    for _ in range(args.rounds):  # interleaved, so a slow spell hits every setting
        for sync in SETTINGS:
            samples[sync].append(measure(sync, args.events, args.window))
    base = [statistics.median(s[k] for s in samples["2m"]) for k in (0, 1)]
    print(f"{args.events} events of {len(BODY)} B, medians of {args.rounds} interleaved rounds")
    print(f"{'sync_interval':<14}{'one-by-one/s':>14}{'ratio':>8}{'windowed/s':>13}{'ratio':>8}")
    for sync in SETTINGS:
        one, windowed = (statistics.median(s[k] for s in samples[sync]) for k in (0, 1))
        print(
            f"{sync:<14}{one:>14,.0f}{one / base[0]:>8.2f}{windowed:>13,.0f}{windowed / base[1]:>8.2f}"
        )


if __name__ == "__main__":
    main()
