"""The JetStream adapter against a real nats-server: stream, dedup, replay, trace headers."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from gpuloom.bus import EventBus, Incoming, Outgoing
from gpuloom.events import (
    Decision,
    JobAdmitted,
    JobSpec,
    JobSubmitted,
    encode,
    make_envelope,
    subject_for,
)
from gpuloom.runtime.reactor import Reactor, pure
from gpuloom.state import ClusterState
from gpuloom.telemetry import extract, inject

pytestmark = pytest.mark.integration


def submitted(job_id: str) -> Outgoing:
    event = JobSubmitted(
        job_id=job_id,
        spec=JobSpec(name="n", user="u", account="a", command=["true"], gpus=0),
    )
    envelope = make_envelope(event, at=datetime.now(UTC), by="test")
    return Outgoing(subject_for(event), encode(envelope), {"Nats-Msg-Id": envelope.id})


async def connect(url: str) -> EventBus:
    return await EventBus.connect(url, "GPULOOM", name="test")


async def test_publish_deduplicates_on_msg_id_and_follow_replays_from_any_seq(
    nats_url: str,
) -> None:
    bus = await connect(nats_url)
    try:
        first = submitted("j1")
        seq1, dup1 = await bus.publish(first)
        seq2, dup2 = await bus.publish(first)
        assert (seq1, dup1) == (seq2, True) or (seq1 == seq2 and dup2)
        assert not dup1
        await bus.publish_many([submitted(f"j{i}") for i in range(2, 7)])
        assert await bus.last_seq() == 6

        got: list[Incoming] = []
        done = asyncio.Event()

        async def on(message: Incoming) -> None:
            got.append(message)
            if message.seq == 6:
                done.set()

        stop = await bus.follow(on, from_seq=3)
        await asyncio.wait_for(done.wait(), 5)
        await stop()
        assert [m.seq for m in got] == [3, 4, 5, 6]
        assert got[-1].pending == 0

        trail = await bus.read_subject("gpuloom.evt.job.j4.*")
        assert [m.seq for m in trail] == [4]
        assert await bus.read_subject("gpuloom.evt.job.nobody.*") == []
    finally:
        await bus.close()


async def test_trace_context_travels_in_headers(nats_url: str) -> None:
    provider = TracerProvider()
    tracer = provider.get_tracer("test")
    bus = await connect(nats_url)
    try:
        with tracer.start_as_current_span("producer") as span:
            message = submitted("traced")
            message.headers.update(inject({}))
            seq, _ = await bus.publish(message)
        stored = await bus.get(seq)
        context = trace.get_current_span(extract(stored.headers)).get_span_context()
        assert context.trace_id == span.get_span_context().trace_id
        assert context.is_remote
    finally:
        await bus.close()


async def test_a_reactor_skips_malformed_messages_and_keeps_deciding(nats_url: str) -> None:
    bus = await connect(nats_url)
    try:
        await bus.publish(Outgoing("gpuloom.evt.job.x.JobSubmitted", b"{not json", {}))
        await bus.publish(Outgoing("gpuloom.evt.job.y.JobSubmitted", b'{"type": "Nope"}', {}))
        await bus.publish(submitted("good"))

        def admit_all(state: ClusterState) -> list[Decision]:
            return [
                Decision(JobAdmitted(job_id=j), f"{j}:admission") for j in sorted(state.submitted)
            ]

        reactor = Reactor(bus, "test-admission", pure(admit_all), tick_s=0.1)
        stop = asyncio.Event()
        task = asyncio.create_task(reactor.run(stop))
        for _ in range(100):
            if reactor.state.jobs.get("good") and reactor.state.jobs["good"].phase == "admitted":
                break
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(task, 5)
        assert reactor.state.jobs["good"].phase == "admitted"
        assert reactor.state.applied == 2  # the good submission and its admission
        assert await bus.last_seq() == 4
    finally:
        await bus.close()
