"""How far the gateway's reads reach: the projections' checkpoints, lag and quarantined
rows (`GET /v1/projections`), whether this gateway keeps up with the log (`/readyz`,
the freshness headers of every read: `services.gateway.freshness`), and the lag as of
a scrape (`/metrics`).

The read model trails the log: both halves of it, the SQL rows (`written_seq`, which
starts at the checkpoint of an earlier run) and the gateway's fold (which replays
from the log). Its lag is the log's end, as last seen, minus the lesser of the two."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

from sqlalchemy import select

from gpuloom.bus.errors import BusError
from gpuloom.store.models import ProjectionCheckpoint, ProjectionQuarantine
from gpuloom.store.quarantine import count_quarantined
from services.gateway.reads.source import Source
from services.gateway.schemas import Projection, Projections, QuarantinedRow, Ready

Staleness = Literal["starting", "lagging", "unavailable"]
Status = Literal["ready", "starting", "lagging", "unavailable"]


class ProgressReads:
    __slots__ = ("_source",)

    def __init__(self, source: Source) -> None:
        self._source = source

    def written_seq(self) -> int:
        """How far the SQL rows reach (0 before the gateway reached NATS)."""
        read_model = self._source.read_model
        return read_model.written_seq if read_model else 0

    def staleness(self) -> tuple[int | None, Staleness | None]:
        """The read model's lag (None: unknown) and why its answers are stale, if they are."""
        read_model = self._source.read_model
        if read_model is None:
            return None, "unavailable"
        lag = read_model.lag
        if min(read_model.written_seq, read_model.state.seq) < self._source.gateway.start_seq:
            return lag, "starting"
        if lag > self._source.settings.ready_max_lag:
            return lag, "lagging"
        return lag, None

    async def lag_behind_stream(self) -> int | None:
        """The lag after asking the stream for its last sequence; None while there is no
        read model or no connection to the log (the bus's errors are the caller's)."""
        read_model, bus = self._source.read_model, self._source.gateway.bus
        if read_model is None or bus is None or not bus.connected:
            return None
        return await read_model.lag_behind_stream()

    async def ready(self, clock: Callable[[], float]) -> Ready:
        """Whether the read model keeps up with the log (`Readiness`, sampled once the
        lag is known, at `clock()`)."""
        readiness = self._source.gateway.readiness
        read_model = self._source.read_model
        written = read_model.written_seq if read_model is not None else 0
        quarantined = read_model.quarantined if read_model is not None else 0
        lag: int | None = None
        try:
            lag = await self.lag_behind_stream()
        except (BusError, TimeoutError, OSError):
            lag = None
        if read_model is None or lag is None:
            status: Status = "unavailable"
            detail = "the event log (NATS) is unreachable: the lag is unknown"
        else:
            status = readiness.observe(lag, clock())
            detail = {
                "ready": f"{lag} events behind the log",
                "starting": f"replaying the log since start: {lag} events to go",
                "lagging": f"{lag} events behind the log for over {readiness.grace_s:g} s",
            }[status]
        return Ready(
            ready=status == "ready",
            status=status,
            lag=lag,
            stream_seq=read_model.stream_seq
            if read_model is not None and lag is not None
            else None,
            written_seq=written,
            max_lag=readiness.max_lag,
            quarantined=quarantined,
            detail=detail,
        )

    async def projections(self, limit: int) -> Projections:
        """Each SQL projection: its checkpoint, its lag behind the log, and at most
        `limit` of its quarantined rows."""
        async with self._source.session() as session:
            checkpoints = {
                row.name: row.last_seq
                for row in await session.scalars(select(ProjectionCheckpoint))
            }
            counts = await count_quarantined(session)
            read_model, bus = self._source.read_model, self._source.gateway.bus
            names = (
                set(checkpoints)
                | set(counts)
                | ({read_model.name} if read_model is not None else set())
            )
            stream_seq: int | None = None
            if bus is not None and bus.connected:
                try:
                    stream_seq = await bus.last_seq()
                except (BusError, TimeoutError, OSError):
                    stream_seq = None
            views = []
            for name in sorted(names):
                checkpoint = checkpoints.get(name, 0)
                live = read_model if read_model is not None and read_model.name == name else None
                lag: int | None = None
                if live is not None and stream_seq is not None:
                    live.stream_seq = max(live.stream_seq, stream_seq)
                    lag = live.lag
                elif stream_seq is not None:  # another process's: its checkpoint follows its fold
                    lag = max(0, stream_seq - checkpoint)
                entries = await session.scalars(
                    select(ProjectionQuarantine)
                    .where(ProjectionQuarantine.projection == name)
                    .order_by(ProjectionQuarantine.kind, ProjectionQuarantine.key)
                    .limit(limit)
                )
                views.append(
                    Projection(
                        name=name,
                        checkpoint=checkpoint,
                        written_seq=live.written_seq if live is not None else None,
                        lag=lag,
                        quarantined=counts.get(name, 0),
                        rows=[_quarantined(entry) for entry in entries],
                    )
                )
        return Projections(stream_seq=stream_seq, projections=views)


def _quarantined(entry: ProjectionQuarantine) -> QuarantinedRow:
    try:
        row: Any = json.loads(entry.row)
    except ValueError:
        row = entry.row
    return QuarantinedRow(
        kind=entry.kind, key=entry.key, seq=entry.seq, error=entry.error, row=row, at=entry.at
    )
