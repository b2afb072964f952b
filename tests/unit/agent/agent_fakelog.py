"""An in-memory log for the agent's unit tests, folded with the one fold.

`FakeLog` plays the part of the stream and of the Reactor for the agent: events
are appended with increasing sequence numbers and folded at once, `publish`
de-duplicates by msg id like JetStream, and it can be told to fail publishes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from gpuloom.events import (
    Decision,
    Event,
    GpuSpec,
    JobAdmitted,
    JobCancelRequested,
    JobPlaced,
    JobQueued,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeLost,
    NodeRecovered,
    NodeRegistered,
    NodeSpec,
    PolicyRef,
    Recorded,
    make_envelope,
)
from gpuloom.state import ClusterState, apply

T0 = datetime(2025, 1, 1, tzinfo=UTC)


class FakeLog:
    def __init__(self) -> None:
        self.state = ClusterState()
        self.caught_up = asyncio.Event()
        self.caught_up.set()
        self.recorded: list[Recorded] = []
        self.msg_ids: set[str] = set()
        self.fail_publishes = 0
        self.now = T0

    # --- the log ---------------------------------------------------------------------

    def append(self, event: Event, at: datetime | None = None) -> Recorded:
        self.now = at or self.now + timedelta(seconds=1)
        envelope = make_envelope(event, at=self.now, by="test")
        recorded = Recorded(len(self.recorded) + 1, envelope, event)
        self.recorded.append(recorded)
        apply(self.state, recorded)
        return recorded

    async def publish(self, decisions: Sequence[Decision]) -> int:
        if not decisions:
            return 0
        if self.fail_publishes > 0:
            self.fail_publishes -= 1
            raise ConnectionError("nats: connection closed")
        for decision in decisions:
            if decision.msg_id in self.msg_ids:
                continue
            self.msg_ids.add(decision.msg_id)
            self.append(decision.event, at=datetime.now(UTC))
        return self.state.seq

    def of_type(self, name: str) -> list[Event]:
        return [r.event for r in self.recorded if r.envelope.type == name]

    def types_of(self, job_id: str) -> list[str]:
        """The event types of one job, in log order."""
        return [
            r.envelope.type for r in self.recorded if getattr(r.event, "job_id", None) == job_id
        ]

    # --- builders --------------------------------------------------------------------

    def node(self, name: str = "node-a", gpus: int = 2) -> None:
        spec = NodeSpec(
            gpus=[
                GpuSpec(index=i, uuid=f"GPU-{name}-{i}", model="A100-80GB", memory_mib=81920)
                for i in range(gpus)
            ],
            simulated=True,
        )
        self.append(NodeRegistered(node=name, spec=spec))

    def submit(
        self,
        job_id: str,
        command: list[str],
        *,
        gpus: int = 0,
        time_limit_s: int | None = None,
        env: dict[str, str] | None = None,
        user: str = "ann",
    ) -> None:
        spec = JobSpec(
            name=job_id,
            user=user,
            account="research",
            command=command,
            gpus=gpus,
            time_limit_s=time_limit_s,
            env=env or {},
        )
        self.append(JobSubmitted(job_id=job_id, spec=spec))
        self.append(JobAdmitted(job_id=job_id))
        self.append(JobQueued(job_id=job_id, priority=0))

    def place(self, job_id: str, node: str = "node-a", gpu_indexes: Sequence[int] = ()) -> int:
        job = self.state.jobs[job_id]
        attempt = job.attempt + 1
        self.append(
            JobPlaced(
                job_id=job_id,
                attempt=attempt,
                node=node,
                gpu_indexes=list(gpu_indexes),
                gpu_uuids=[f"GPU-{node}-{i}" for i in gpu_indexes],
                basis_seq=self.state.seq,
                cycle_position=0,
                policy=PolicyRef(name="test", version=1),
            )
        )
        assert self.state.jobs[job_id].attempt == attempt, self.state.recent_voided
        return attempt

    def run(self, job_id: str, command: list[str], node: str = "node-a", **kw: object) -> int:
        """Submit and place a job; returns its attempt."""
        gpu_indexes = kw.pop("gpu_indexes", ())
        self.submit(job_id, command, **kw)  # type: ignore[arg-type]
        return self.place(job_id, node, gpu_indexes)  # type: ignore[arg-type]

    def started(self, job_id: str, node: str = "node-a", at: datetime | None = None) -> None:
        attempt = self.state.jobs[job_id].attempt
        self.append(JobStarted(job_id=job_id, attempt=attempt, node=node, pid=1), at=at)

    def cancel(self, job_id: str) -> None:
        self.append(JobCancelRequested(job_id=job_id, requested_by="ann"))

    def lose(self, node: str = "node-a") -> None:
        self.append(NodeLost(node=node, reason="test"))

    def recover(self, node: str = "node-a") -> None:
        self.append(NodeRecovered(node=node))
