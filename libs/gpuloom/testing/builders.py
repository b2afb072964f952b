"""Builders of events and logs for tests: short calls that read like the story they tell.

    log = LogBuilder()
    log.register("n1", gpus=4)
    log.submit("j1", gpus=2)
    log.admit("j1")
    log.queue("j1")
    log.place("j1", "n1", [0, 1])
    state = log.state()

Everything is deterministic: envelope ids are `evt-<seq>`, the first event is at
`T0` and each next one a step (1 s unless told) later, and GPU uuids follow
`gpu_uuid(node, index)`. Nothing here reads a clock or a random source.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, overload

from gpuloom.events import (
    Decision,
    Event,
    GpuSpec,
    JobAdmitted,
    JobCancelled,
    JobCancelRequested,
    JobFinished,
    JobPlaced,
    JobQueued,
    JobRejected,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeLost,
    NodeRecovered,
    NodeRegistered,
    NodeSpec,
    Outcome,
    PolicyRef,
    Recorded,
    UsageCharged,
    make_envelope,
)
from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.state import ClusterState, fold

#: When the first event of every built log happened.
T0 = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
DEFAULT_MODEL = "A100-80GB"
TEST_POLICY = PolicyRef(name="test", version=1)


def gpu_uuid(node: str, index: int) -> str:
    """The uuid builders give GPU `index` of `node`."""
    return f"GPU-{node}-{index}"


def make_gpus(
    node: str,
    count: int,
    model: str = DEFAULT_MODEL,
    *,
    first_index: int = 0,
    memory_mib: int = 81920,
) -> list[GpuSpec]:
    """`count` GPUs of one model with consecutive indexes from `first_index`."""
    return [
        GpuSpec(index=i, uuid=gpu_uuid(node, i), model=model, memory_mib=memory_mib)
        for i in range(first_index, first_index + count)
    ]


def make_node_spec(
    name: str,
    gpus: int = 4,
    model: str = DEFAULT_MODEL,
    *,
    gpu_list: Sequence[GpuSpec] | None = None,
    labels: dict[str, str] | None = None,
) -> NodeSpec:
    """The spec of a node with `gpus` GPUs of `model` (or exactly `gpu_list`)."""
    listed = list(gpu_list) if gpu_list is not None else make_gpus(name, gpus, model)
    return NodeSpec(
        gpus=listed, cpu_milli=64_000, memory_mib=512_000, labels=labels or {}, simulated=True
    )


def make_node(
    name: str,
    gpus: int = 4,
    model: str = DEFAULT_MODEL,
    *,
    gpu_list: Sequence[GpuSpec] | None = None,
    labels: dict[str, str] | None = None,
) -> NodeRegistered:
    """NodeRegistered for a node with `gpus` GPUs of `model` (or exactly `gpu_list`)."""
    spec = make_node_spec(name, gpus, model, gpu_list=gpu_list, labels=labels)
    return NodeRegistered(node=name, spec=spec)


def make_job_spec(
    gpus: int = 1,
    *,
    name: str = "train",
    user: str = "alice",
    account: str = "research",
    gpu_model: Sequence[str] = (),
    priority: int = 0,
    command: Sequence[str] = ("python", "train.py"),
    time_limit_s: int | None = None,
    env: dict[str, str] | None = None,
    **extra: Any,
) -> JobSpec:
    """A valid JobSpec; `extra` sets the other fields (gpu_milli, pool, locality...)."""
    return JobSpec(
        **extra,
        name=name,
        user=user,
        account=account,
        command=list(command),
        gpus=gpus,
        gpu_model=list(gpu_model),
        priority=priority,
        time_limit_s=time_limit_s,
        env=env or {},
    )


class LogBuilder:
    """An in-memory log: appends events with increasing seq and envelope `at`.

    `at` of an appended event is the given `at`, else the previous event's `at`
    plus `after` seconds (default: `step`); the first event is at `start`.
    """

    def __init__(
        self,
        start: datetime = T0,
        step: timedelta = timedelta(seconds=1),
        by: str = "test",
        first_seq: int = 1,
    ) -> None:
        self.records: list[Recorded] = []
        self.step = step
        self.by = by
        self._start = start
        self._next_seq = first_seq

    # --- the log -------------------------------------------------------------------

    @property
    def now(self) -> datetime:
        """`at` of the latest event (the start before any)."""
        return self.records[-1].envelope.at if self.records else self._start

    @property
    def seq(self) -> int:
        """Seq of the latest event (0 before any)."""
        return self.records[-1].seq if self.records else self._next_seq - 1

    def next_at(self, after: float | None = None) -> datetime:
        if not self.records:
            return self._start if after is None else self._start + timedelta(seconds=after)
        return self.now + (self.step if after is None else timedelta(seconds=after))

    def append(
        self,
        event: Event,
        *,
        at: datetime | None = None,
        after: float | None = None,
        causation_id: str | None = None,
        by: str | None = None,
    ) -> Recorded:
        """Record `event` as the next entry of the log and return it."""
        seq = self._next_seq
        envelope = make_envelope(
            event,
            at=at if at is not None else self.next_at(after),
            by=by or self.by,
            event_id=f"evt-{seq:06d}",
            causation_id=causation_id,
        )
        recorded = Recorded(seq=seq, envelope=envelope, event=event)
        self.records.append(recorded)
        self._next_seq += 1
        return recorded

    def extend(self, events: Iterable[Event]) -> list[Recorded]:
        return [self.append(event) for event in events]

    def record_decisions(self, decisions: Iterable[Decision]) -> list[Recorded]:
        """Append the events of `Decision`s, with their causation ids."""
        return [self.append(d.event, causation_id=d.causation_id) for d in decisions]

    def state(self, upto: int | None = None, *, keep_history: bool = False) -> ClusterState:
        """A fresh fold of the first `upto` events (all when None); `keep_history`:
        jobs that ended stay in `jobs` (to look at their last state)."""
        records = self.records if upto is None else self.records[:upto]
        return fold(records, keep_history=keep_history)

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[Recorded]:
        return iter(self.records)

    @overload
    def __getitem__(self, index: int) -> Recorded: ...
    @overload
    def __getitem__(self, index: slice) -> list[Recorded]: ...
    def __getitem__(self, index: int | slice) -> Recorded | list[Recorded]:
        return self.records[index]

    # --- sentences -----------------------------------------------------------------

    def register(
        self,
        name: str,
        gpus: int = 4,
        model: str = DEFAULT_MODEL,
        *,
        gpu_list: Sequence[GpuSpec] | None = None,
        **kw: Any,
    ) -> Recorded:
        return self.append(make_node(name, gpus, model, gpu_list=gpu_list), **kw)

    def lose(self, node: str, reason: str = "no heartbeat", **kw: Any) -> Recorded:
        return self.append(NodeLost(node=node, reason=reason), **kw)

    def recover(self, node: str, **kw: Any) -> Recorded:
        return self.append(NodeRecovered(node=node), **kw)

    def submit(
        self,
        job_id: str,
        spec: JobSpec | None = None,
        *,
        idempotency_key: str | None = None,
        at: datetime | None = None,
        after: float | None = None,
        **spec_fields: Any,
    ) -> Recorded:
        """JobSubmitted with `spec`, or with `make_job_spec(**spec_fields)`."""
        event = JobSubmitted(
            job_id=job_id,
            spec=spec if spec is not None else make_job_spec(**spec_fields),
            idempotency_key=idempotency_key,
        )
        return self.append(event, at=at, after=after)

    def admit(self, job_id: str, **kw: Any) -> Recorded:
        return self.append(JobAdmitted(job_id=job_id), **kw)

    def reject(self, job_id: str, reason: str = "does not fit", **kw: Any) -> Recorded:
        return self.append(JobRejected(job_id=job_id, reason=reason), **kw)

    def queue(self, job_id: str, priority: int = 0, **kw: Any) -> Recorded:
        return self.append(JobQueued(job_id=job_id, priority=priority), **kw)

    def request_cancel(self, job_id: str, **kw: Any) -> Recorded:
        return self.append(JobCancelRequested(job_id=job_id, requested_by="alice"), **kw)

    def cancel(self, job_id: str, **kw: Any) -> Recorded:
        return self.append(JobCancelled(job_id=job_id), **kw)

    def place(
        self,
        job_id: str,
        node: str,
        gpu_indexes: Sequence[int] = (),
        *,
        attempt: int = 1,
        gpu_uuids: Sequence[str] | None = None,
        basis_seq: int | None = None,
        **kw: Any,
    ) -> Recorded:
        """JobPlaced with the builders' uuids of `gpu_indexes` unless `gpu_uuids` is given."""
        event = JobPlaced(
            job_id=job_id,
            attempt=attempt,
            node=node,
            gpu_indexes=list(gpu_indexes),
            gpu_uuids=list(gpu_uuids)
            if gpu_uuids is not None
            else [gpu_uuid(node, i) for i in gpu_indexes],
            basis_seq=self.seq if basis_seq is None else basis_seq,
            cycle_position=0,
            policy=TEST_POLICY,
        )
        return self.append(event, **kw)

    def start(self, job_id: str, node: str, *, attempt: int = 1, **kw: Any) -> Recorded:
        return self.append(JobStarted(job_id=job_id, attempt=attempt, node=node, pid=4242), **kw)

    def finish(
        self,
        job_id: str,
        node: str,
        outcome: Outcome = "succeeded",
        *,
        attempt: int = 1,
        exit_code: int | None = 0,
        **kw: Any,
    ) -> Recorded:
        event = JobFinished(
            job_id=job_id, attempt=attempt, node=node, outcome=outcome, exit_code=exit_code
        )
        return self.append(event, **kw)

    def charge(
        self,
        job_id: str,
        *,
        attempt: int = 1,
        gpus: int = 1,
        seconds: float = 1.0,
        user: str = "alice",
        account: str = "research",
        **kw: Any,
    ) -> Recorded:
        event = UsageCharged(
            job_id=job_id,
            attempt=attempt,
            user=user,
            account=account,
            gpus=gpus,
            seconds=seconds,
            gpu_milli_seconds=round(gpus * MILLI_PER_GPU * seconds),
        )
        return self.append(event, **kw)

    def run_to_queue(self, job_id: str, priority: int = 0, **spec_fields: Any) -> Recorded:
        """Submit, admit and queue a job; returns the JobQueued."""
        self.submit(job_id, priority=priority, **spec_fields)
        self.admit(job_id)
        return self.queue(job_id, priority=priority)
