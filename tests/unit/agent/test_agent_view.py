"""The agent on the log kept in memory, end to end: events published to the log reach
its nodes' view (`ViewFollower`) through a dispatcher, and its Reactor runs a job
placed there and reports it on the log. The same path on real NATS is the
integration tests'."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from agent_events import cancel, lose, msg_ids, register, run_job, types_of
from test_agent_flow import ENVIRON, phase

from gpuloom.bus.messages import Incoming, Outgoing, Received
from gpuloom.bus.streams import view_stream
from gpuloom.events.subjects import sync_subject, view_job_subject, view_position_subject
from gpuloom.runtime.reactor import Reactor
from gpuloom.state.nodeview import (
    Record,
    Route,
    encode_gone,
    encode_position,
    encode_record,
    everything,
    route,
)
from gpuloom.testing.memlog import MemoryLog
from services.agent.agent import Agent
from services.agent.shim import RunDir
from services.agent.view import ViewFollower


class Dispatching:
    """The dispatcher's part, kept small (`services.dispatch` is the real one, on the
    same pure `route`, on only the jobs each event changed): after each event of the
    log, the records and tombstones of every routed job and a position for every node; a sync request is noted and
    answered with the position reached."""

    def __init__(self, log: MemoryLog, nodes: Sequence[str]) -> None:
        self.log = log
        self.views = log.on_stream(view_stream(log.stream))
        self.nodes = sorted(nodes)
        self.sent: dict[str, frozenset[str]] = {}
        self.routed = 0
        #: (node, seq) of every sync request, in order.
        self.syncs: list[tuple[str, int]] = []
        self._stops: list[Callable[[], Awaitable[None]]] = []

    async def start(self) -> None:
        self._stops = [
            await self.log.follow(self.on_event),
            await self.log.serve(sync_subject("*"), self.on_sync),
        ]

    async def close(self) -> None:
        for stop in self._stops:
            await stop()

    async def on_event(self, message: Incoming) -> None:
        state = self.log.state  # folded up to the log's end: this event and any after
        if state.seq <= self.routed:
            return
        routes = route(state, everything(state, self.sent), self.sent)  # small: all of it
        body, headers = encode_position(state.seq)
        positions = [Outgoing(view_position_subject(n), body, headers) for n in self.nodes]
        await self.views.publish_many([self.message(r) for r in routes] + positions)
        self.routed = state.seq

    async def on_sync(self, request: Received) -> None:
        node = request.subject.rsplit(".", 1)[-1]
        self.syncs.append((node, json.loads(request.data)["seq"]))
        body, headers = encode_position(self.routed)
        await self.views.publish(Outgoing(view_position_subject(node), body, headers))

    @staticmethod
    def message(routed: Route) -> Outgoing:
        if isinstance(routed, Record):
            body, headers = encode_record(routed.job)
            return Outgoing(view_job_subject(routed.node, routed.job.job_id), body, headers)
        body, headers = encode_gone(routed)
        return Outgoing(view_job_subject(routed.node, routed.job_id), body, headers)


async def take_until(view: ViewFollower, condition: Callable[[], bool], timeout: float = 5) -> None:
    """Take view messages, as the Reactor's loop does, until `condition()`."""

    async def taking() -> None:
        while not condition():
            await view.fold_next(0.05)

    await asyncio.wait_for(taking(), timeout)


async def test_events_published_to_the_log_reach_the_view_of_the_agents_nodes(
    log: MemoryLog,
) -> None:
    register(log, "node-b")
    run_job(log, "j1", ["sleep", "30"], gpus=1, gpu_indexes=[1])
    run_job(log, "elsewhere", ["sleep", "30"], node="node-b")
    last = await log.last_seq()
    dispatcher = Dispatching(log, ["node-a", "node-b"])
    await dispatcher.start()
    view, stop = ViewFollower(log, ["node-a"]), asyncio.Event()
    await view.start(stop, at_most=None)
    try:
        await take_until(view, view.is_caught_up)
        assert view.catch_up_seq == last and view.complete_seq() >= last
        assert dispatcher.syncs[0] == ("node-a", last), "it asked for its view at start"
        assert set(view.state.jobs) == {"j1"}, "node-b's job is not sent to node-a"
        job = view.state.jobs["j1"]
        assert (job.phase, job.attempt, job.node, job.gpu_indexes) == ("placed", 1, "node-a", (1,))
        assert job.spec == log.state.jobs["j1"].spec

        cancel(log, "j1")  # written once the agent follows: it reaches the view too
        await take_until(view, lambda: view.state.jobs["j1"].cancel_requested)
        lose(log, "node-a")  # the job is requeued: it leaves the node's view
        await take_until(view, lambda: "j1" not in view.state.jobs)
        assert view.complete_seq() == log.state.seq and view.skipped == 0
    finally:
        stop.set()
        await view.close()
        await dispatcher.close()


async def test_the_agent_runs_a_job_from_its_view_and_reports_it_on_the_log(
    log: MemoryLog, run_root: Path
) -> None:
    run_job(log, "j1", ["sh", "-c", "echo hello"])
    dispatcher = Dispatching(log, ["node-a"])
    await dispatcher.start()
    agent = Agent(["node-a"], run_root, grace_s=1.0, poll_s=0.02, environ=ENVIRON)
    view, stop = ViewFollower(log, ["node-a"]), asyncio.Event()
    agent.complete = view.complete_seq
    reactor = Reactor(log, "agent", agent.decide, tick_s=0.05, follower=view)
    tasks = [
        asyncio.create_task(reactor.run(stop)),
        asyncio.create_task(agent.runner.run(stop)),
        asyncio.create_task(agent.run_outbox(reactor, stop, retry_s=0.05)),
    ]
    try:
        done = phase(log, "j1")
        await asyncio.wait_for(_until(lambda: done() and "j1" not in view.state.jobs), 8)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        await dispatcher.close()

    assert types_of(log, "j1")[-2:] == ["JobStarted", "JobFinished"]
    assert {"j1:started:1", "j1:finished:1"} <= msg_ids(log)
    assert log.state.voided == 0 and not log.letters
    assert RunDir(agent.runner.root, "node-a", "j1", 1).file("stdout").read_text() == "hello\n"


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.02)
