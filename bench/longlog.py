"""A long, valid gpuloom log written straight onto a real stream (bench/restart_catchup.py).

100 nodes x 8 GPUs register, then finished jobs arrive at 10,000 a day, each with the
seven events the services would write: JobSubmitted, JobAdmitted, JobQueued, JobPlaced,
JobStarted, JobFinished (1 in 20 failed), UsageCharged. Job k runs on node k % 100,
GPU (k // 100) % 8, for 5 to 95 minutes; the next job on that GPU comes 800 jobs
(1.9 h) later, so the GPU is free again. Events are written in the order of their
time (`at`), as they would have been, interleaved across jobs; the last one is
about now. Then the live jobs: up to 800 running (one per GPU), the rest queued.

Nothing here reads a random source: the same arguments write the same events (but
for the envelope ids, ULIDs as the services make them).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from gpuloom.bus import EventBus, Outgoing
from gpuloom.events import (
    Event,
    JobAdmitted,
    JobFinished,
    JobPlaced,
    JobQueued,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeRegistered,
    NodeSpec,
    PolicyRef,
    Recorded,
    ReplicaAssignment,
    SliceRef,
    UsageCharged,
    encode,
    make_envelope,
    subject_for,
)
from gpuloom.state import ClusterState, apply
from gpuloom.testing.builders import DEFAULT_MODEL, gpu_uuid, make_gpus, make_job_spec

NODES, GPUS = 100, 8
EVENTS_PER_JOB = 7
JOB_EVERY_S = 86_400 / 10_000
GPU_MEMORY_MIB = 81_920
POLICY = PolicyRef(name="bestfit", version=1)
#: (at, job, step, kind): an event to write, built when its sequence is known.
Pending = tuple[float, int, int, str]


def finished_jobs(events: int) -> int:
    """How many finished jobs make a log of about `events` events (nodes included)."""
    return max(0, (events - NODES) // EVENTS_PER_JOB)


def node(k: int) -> str:
    return f"node-{k % NODES:03d}"


def gpu(k: int) -> int:
    return (k // NODES) % GPUS


def run_s(k: int) -> int:
    """5 to 95 minutes: under the 800 * 8.64 s before the next job on the same GPU."""
    return 300 + (k * 7919) % 5400


class LongLog:
    """The events of the log, in order, each with its `at` (epoch seconds)."""

    def __init__(self, jobs: int, live: int, end: float) -> None:
        self.jobs, self.live = jobs, live
        self.span = jobs * JOB_EVERY_S + 2 * 3600 + live * JOB_EVERY_S
        self.t0 = end - self.span
        self.seq = 0

    def spec(self, k: int) -> JobSpec:
        user = k % 40
        return make_job_spec(
            1, name=f"train-{k % 50}", user=f"user{user}", account=f"acct{user % 8}"
        )

    def event(self, k: int, kind: str, at: float) -> Event:
        job_id = f"job-{k:08d}"
        if kind == "submitted":
            return JobSubmitted(job_id=job_id, spec=self.spec(k))
        if kind == "admitted":
            return JobAdmitted(job_id=job_id)
        if kind == "queued":
            return JobQueued(job_id=job_id, priority=0)
        if kind == "placed":
            uuid = gpu_uuid(node(k), gpu(k))
            piece = SliceRef(
                node=node(k), index=gpu(k), uuid=uuid, milli=1000, memory_mib=GPU_MEMORY_MIB
            )
            return JobPlaced(
                job_id=job_id,
                attempt=1,
                node=node(k),
                gpu_indexes=[gpu(k)],
                gpu_uuids=[uuid],
                replicas=[ReplicaAssignment(host=node(k), slices=[piece])],
                basis_seq=self.seq,
                cycle_position=0,
                policy=POLICY,
            )
        if kind == "started":
            return JobStarted(job_id=job_id, attempt=1, node=node(k), pid=10_000 + k % 50_000)
        failed = k % 20 == 7
        if kind == "finished":
            return JobFinished(
                job_id=job_id,
                attempt=1,
                node=node(k),
                outcome="failed" if failed else "succeeded",
                exit_code=1 if failed else 0,
                ended_at=datetime.fromtimestamp(at, UTC),
            )
        spec = self.spec(k)
        return UsageCharged(
            job_id=job_id,
            attempt=1,
            user=spec.user,
            account=spec.account,
            gpus=1,
            seconds=float(run_s(k)),
            gpu_milli_seconds=1000 * run_s(k),
            by_model={DEFAULT_MODEL: 1000 * run_s(k)},
        )

    def lifecycle(self, k: int, submit: float, steps: int) -> list[Pending]:
        offsets = [0.0, 0.05, 0.1, 0.2, 1.0, 1.0 + run_s(k), 1.5 + run_s(k)]
        kinds = ["submitted", "admitted", "queued", "placed", "started", "finished", "charged"]
        return [(submit + offsets[i], k, i, kinds[i]) for i in range(steps)]

    def pending(self) -> Iterator[Pending]:
        """The events after the nodes, in time order."""
        heap: list[Pending] = []
        for k in range(self.jobs):
            submit = self.t0 + 60 + k * JOB_EVERY_S
            while heap and heap[0][0] < submit:
                yield heapq.heappop(heap)
            for item in self.lifecycle(k, submit, EVENTS_PER_JOB):
                heapq.heappush(heap, item)
        while heap:
            yield heapq.heappop(heap)
        start = self.t0 + 60 + self.jobs * JOB_EVERY_S + 2 * 3600
        for i in range(self.live):
            k = self.jobs + i
            # running jobs hold the GPU of k; the rest wait behind a full cluster
            yield from self.lifecycle(k, start + i * JOB_EVERY_S, 5 if i < NODES * GPUS else 3)

    def __iter__(self) -> Iterator[tuple[float, Event, str]]:
        """(at, event, writer) for every event of the log, in order."""
        for n in range(NODES):
            spec = NodeSpec(gpus=make_gpus(node(n), GPUS), cpu_milli=128_000, memory_mib=1_024_000)
            self.seq += 1
            yield self.t0, NodeRegistered(node=node(n), spec=spec), "inventory"
        writers = {"submitted": "gateway", "admitted": "admission", "queued": "queue"}
        writers |= {"placed": "placement", "charged": "accounting"}
        for at, k, _, kind in self.pending():
            event = self.event(k, kind, at)
            self.seq += 1
            yield at, event, writers.get(kind, f"agent-{k % NODES // 25}")


def validate(jobs: int, live: int) -> ClusterState:
    """Fold a small log made the same way (`stored_at` unknown): every event applied."""
    state = ClusterState()
    for seq, (at, event, by) in enumerate(LongLog(jobs, live, time.time()), start=1):
        envelope = make_envelope(event, at=datetime.fromtimestamp(at, UTC), by=by)
        apply(state, Recorded(seq, envelope, event))
    if state.voided:
        reasons = [v.reason for v in state.recent_voided[:3]]
        raise AssertionError(f"the generated log voids {state.voided} events: {reasons}")
    return state


async def write(bus: EventBus, log: LongLog, clock: str, batch: int = 2000) -> int:
    """Publish every event of `log` (pipelined, `batch` at a time); the last sequence.

    `clock`: "history" keeps each event's `at`; "now" stamps it with the time of writing.
    """
    messages: list[Outgoing] = []
    last = 0
    for at, event, by in log:
        when = datetime.fromtimestamp(at, UTC)
        if clock == "now":
            when = datetime.now(UTC) + timedelta(microseconds=len(messages))
        envelope = make_envelope(event, at=when, by=by)
        msg_id = f"bench:{event.TYPE}:{event.aggregate_id()}"
        messages.append(Outgoing(subject_for(event), encode(envelope), {"Nats-Msg-Id": msg_id}))
        if len(messages) >= batch:
            last = max(await bus.publish_many(messages, timeout=60))
            messages = []
    if messages:
        last = max(await bus.publish_many(messages, timeout=60))
    return last
