"""What the agent's unit tests write to the log (`gpuloom.testing.memlog.MemoryLog`) and
read back from it, and the agent's Reactor as its outbox sees it.

The tests write as the other services would: each event encoded in its envelope,
stamped by the log's clock, on its own subject; the agent's decisions go through the
Reactor's own publishing (`Nats-Msg-Id`: the intent key, which the log de-duplicates).
What a test reads back is the log decoded, and `MemoryLog.state`, its fold.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from gpuloom.bus.messages import Outgoing
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
    decode,
    encode,
    make_envelope,
    subject_for,
)
from gpuloom.runtime.reactor import Reactor
from gpuloom.state import ClusterState
from gpuloom.testing.memlog import MemoryLog

# --- writing ---------------------------------------------------------------------------


def write(log: MemoryLog, event: Event) -> int:
    """Append `event` as its writer would (at the log's time); its sequence."""
    envelope = make_envelope(event, at=log.clock(), by="test")
    seq, _ = log.append(Outgoing(subject_for(event), encode(envelope), {}))
    return seq


def register(log: MemoryLog, name: str = "node-a", gpus: int = 2) -> None:
    spec = NodeSpec(
        gpus=[
            GpuSpec(index=i, uuid=f"GPU-{name}-{i}", model="A100-80GB", memory_mib=81920)
            for i in range(gpus)
        ],
        simulated=True,
    )
    write(log, NodeRegistered(node=name, spec=spec))


def submit(
    log: MemoryLog,
    job_id: str,
    command: list[str],
    *,
    gpus: int = 0,
    time_limit_s: int | None = None,
    env: dict[str, str] | None = None,
    user: str = "ann",
) -> None:
    """Submit, admit and queue a job."""
    spec = JobSpec(
        name=job_id,
        user=user,
        account="research",
        command=command,
        gpus=gpus,
        time_limit_s=time_limit_s,
        env=env or {},
    )
    write(log, JobSubmitted(job_id=job_id, spec=spec))
    write(log, JobAdmitted(job_id=job_id))
    write(log, JobQueued(job_id=job_id, priority=0))


def place(
    log: MemoryLog, job_id: str, node: str = "node-a", gpu_indexes: Sequence[int] = ()
) -> int:
    """Place a queued job on `node`; returns its attempt."""
    state = log.state
    attempt = state.jobs[job_id].attempt + 1
    write(
        log,
        JobPlaced(
            job_id=job_id,
            attempt=attempt,
            node=node,
            gpu_indexes=list(gpu_indexes),
            gpu_uuids=[f"GPU-{node}-{i}" for i in gpu_indexes],
            basis_seq=state.seq,
            cycle_position=0,
            policy=PolicyRef(name="test", version=1),
        ),
    )
    assert log.state.jobs[job_id].attempt == attempt, log.state.recent_voided
    return attempt


def run_job(
    log: MemoryLog,
    job_id: str,
    command: list[str],
    node: str = "node-a",
    *,
    gpu_indexes: Sequence[int] = (),
    gpus: int = 0,
    time_limit_s: int | None = None,
    env: dict[str, str] | None = None,
    user: str = "ann",
) -> int:
    """Submit and place a job; returns its attempt."""
    submit(log, job_id, command, gpus=gpus, time_limit_s=time_limit_s, env=env, user=user)
    return place(log, job_id, node, gpu_indexes)


def start(log: MemoryLog, job_id: str, node: str = "node-a") -> None:
    """The job's current attempt started (as its agent would report it)."""
    attempt = log.state.jobs[job_id].attempt
    write(log, JobStarted(job_id=job_id, attempt=attempt, node=node, pid=1))


def cancel(log: MemoryLog, job_id: str) -> None:
    write(log, JobCancelRequested(job_id=job_id, requested_by="ann"))


def lose(log: MemoryLog, node: str = "node-a") -> None:
    write(log, NodeLost(node=node, reason="test"))


def recover(log: MemoryLog, node: str = "node-a") -> None:
    write(log, NodeRecovered(node=node))


# --- reading ---------------------------------------------------------------------------


def recorded(log: MemoryLog) -> list[Recorded]:
    """Every event of the log, decoded, in log order."""
    return [decode(m.seq, m.body, m.stored_at, subject=m.subject) for m in log.messages]


def of_type(log: MemoryLog, name: str) -> list[Event]:
    return [r.event for r in recorded(log) if r.envelope.type == name]


def types_of(log: MemoryLog, job_id: str) -> list[str]:
    """The event types of one job, in log order."""
    return [r.envelope.type for r in recorded(log) if getattr(r.event, "job_id", None) == job_id]


def msg_ids(log: MemoryLog) -> set[str]:
    """The intent keys (`Nats-Msg-Id`) the log was given."""
    return {m.headers["Nats-Msg-Id"] for m in log.messages if "Nats-Msg-Id" in m.headers}


# --- the agent's Reactor ---------------------------------------------------------------


class AgentReactor:
    """The agent's Reactor as its outbox needs it (`services.agent.agent.LogPort`),
    caught up: its state is the log's fold, its decisions are published by a real
    `Reactor` on the log. The tests drive the decisions themselves (`drive`), where
    the Reactor's loop would."""

    def __init__(self, log: MemoryLog) -> None:
        self.log = log
        self._reactor = Reactor(log, "agent", _decides_nothing)
        self.caught_up = asyncio.Event()
        self.caught_up.set()

    @property
    def state(self) -> ClusterState:
        return self.log.state

    async def publish(self, decisions: Sequence[Decision]) -> int:
        return await self._reactor.publish(decisions)


async def _decides_nothing(state: ClusterState) -> Sequence[Decision]:
    return ()


async def publish(log: MemoryLog, decisions: Sequence[Decision]) -> int:
    """Publish the agent's decisions as its Reactor does."""
    return await AgentReactor(log).publish(decisions)
