"""The per-node view: each node's jobs, routed to that node alone.

An agent needs the jobs placed on its nodes (spec, attempt, replicas and their
slices, the rendezvous, a cancel request or a preemption, the ends of the other
replicas of a gang) and nothing else. The log holds every job's command and
environment, so agents no longer read it: the dispatch process (`services.dispatch`)
folds the log with the one fold and routes, for each job placed or running on a node,
the fold's own `JobState` to that node's subjects of the view stream; when the job
leaves the node (it ended, was requeued, moved), a tombstone. An agent keeps what it
is sent in a `NodeView`, whose `state` is a `ClusterState` of just those jobs, so its
decisions read it as they read the whole fold (`services.agent.reconcile`).

Ordering. A record carries the sequence of the last event that changed its job
(`JobState.last_seq`), a tombstone the sequence at which the job left; a view never
takes anything older than what it holds for that job on that node, so a record sent
again late (a second dispatcher, a restart) changes nothing. A position `(node,
seq)` is sent after every record of the node for the events up to `seq`: the view
of that node is complete up to there. An agent's own events name its node in their
subject, so the dispatcher always sends a position after one (`touched_nodes`),
which is how the agent knows its writes are in its view.

`route` is pure (the dispatcher's decision), and so is `NodeView` (the agent's fold);
the bytes are `encode_record` and `decode_record`, the fold's own state codec.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache

from pydantic_core import ValidationError

from gpuloom.state.model import ON_NODE_PHASES, ClusterState, JobState
from gpuloom.state.snapshot_schema import job_codec, shape_fingerprint

#: Tombstones a view remembers (per node and job) to refuse a late, older record; the
#: oldest are forgotten first. Far more than the jobs that pass through a node while
#: a late record can still be on its way.
GONE_KEPT = 100_000


class RecordError(ValueError):
    """A view message that cannot be read: damaged, or written by another version."""


@dataclass(frozen=True, slots=True)
class Record:
    """`job` as it stands, for its replica(s) on `node`."""

    node: str
    job: JobState


@dataclass(frozen=True, slots=True)
class Gone:
    """`job_id` left `node` at `seq` (ended, requeued, moved, forgotten)."""

    node: str
    job_id: str
    seq: int


Route = Record | Gone


def hosts(job: JobState | None) -> frozenset[str]:
    """The nodes whose agents run a replica of `job` now (none unless placed or running)."""
    if job is None or job.phase not in ON_NODE_PHASES:
        return frozenset()
    if job.replicas:
        return frozenset(replica.host for replica in job.replicas)
    return frozenset({job.node}) if job.node is not None else frozenset()


def route(
    state: ClusterState, changed: Iterable[str], sent: dict[str, frozenset[str]]
) -> list[Route]:
    """What to send for the jobs in `changed`: a record to each node that hosts the
    job now, a tombstone to each node that had its record (`sent`) and no longer
    hosts it. Updates `sent` (job id -> the nodes holding its record), in job id order."""
    routes: list[Route] = []
    for job_id in sorted(set(changed)):
        job = state.jobs.get(job_id)
        now = hosts(job)
        before = sent.get(job_id, frozenset())
        routes.extend(Record(node, job) for node in sorted(now) if job is not None)
        left_at = job.last_seq if job is not None else state.seq
        routes.extend(Gone(node, job_id, left_at) for node in sorted(before - now))
        if now:
            sent[job_id] = now
        else:
            sent.pop(job_id, None)
    return routes


def everything(state: ClusterState, sent: dict[str, frozenset[str]]) -> list[str]:
    """Every job that is or was routed: what a dispatcher looks at when it cannot know
    what changed (at start, or when the change feed was trimmed)."""
    on_nodes = {job_id for jobs in state.on_node.values() for job_id in jobs}
    return sorted(on_nodes | set(sent))


# --- the agent's side ------------------------------------------------------------


class NodeView:
    """What an agent knows of its nodes: the records and tombstones it was sent, as a
    `ClusterState` holding its nodes' jobs (`state.jobs`, `state.on_node`). Its `seq`
    is the newest position of any node: it moves whenever the view does (a reactor
    decides again when it moves); `complete` says how far each node's view reaches."""

    def __init__(self, nodes: Sequence[str]) -> None:
        self.state = ClusterState()
        self.positions = dict.fromkeys(sorted(nodes), 0)
        #: (node, job) -> the sequence of the record it holds.
        self._live: dict[tuple[str, str], int] = {}
        #: (node, job) -> the sequence it left the node at (bounded: `GONE_KEPT`).
        self._gone: dict[tuple[str, str], int] = {}

    def _latest(self, key: tuple[str, str]) -> int:
        return max(self._live.get(key, 0), self._gone.get(key, 0))

    def take(self, node: str, job: JobState) -> bool:
        """Hold `job` for `node` unless the view holds something as new; True if taken."""
        key = (node, job.job_id)
        if node not in self.positions or job.last_seq <= self._latest(key):
            return False
        self._live[key] = job.last_seq
        self._gone.pop(key, None)
        held = self.state.jobs.get(job.job_id)
        if held is None or job.last_seq >= held.last_seq:
            self.state.jobs[job.job_id] = job
        self.state.on_node.setdefault(node, set()).add(job.job_id)
        return True

    def drop(self, node: str, job_id: str, seq: int) -> bool:
        """`job_id` left `node` at `seq` (a record of the same sequence loses to it)."""
        key = (node, job_id)
        if node not in self.positions or seq < self._latest(key):
            return False
        self._live.pop(key, None)
        self._gone.pop(key, None)
        self._gone[key] = seq
        if len(self._gone) > GONE_KEPT:
            del self._gone[next(iter(self._gone))]
        on_node = self.state.on_node.get(node)
        if on_node is not None:
            on_node.discard(job_id)
            if not on_node:
                del self.state.on_node[node]
        if not any(job_id in jobs for jobs in self.state.on_node.values()):
            self.state.jobs.pop(job_id, None)
        return True

    def advance(self, node: str, seq: int) -> None:
        """The view of `node` is complete up to `seq`."""
        if node in self.positions and seq > self.positions[node]:
            self.positions[node] = seq
            self.state.seq = max(self.state.seq, seq)

    def complete(self, node: str, seq: int) -> bool:
        """Whether the view of `node` holds every event up to `seq`."""
        return self.positions.get(node, 0) >= seq


# --- bytes -------------------------------------------------------------------------

#: What a view message is (the header `Gpuloom-View`): a record, a tombstone, a position.
KIND_HEADER = "Gpuloom-View"
#: The record's shape (`shape_fingerprint(JobState)`): a record of another shape is
#: refused, never misread (dispatcher and agents are upgraded together).
SHAPE_HEADER = "Gpuloom-Shape"


@cache
def record_shape() -> str:
    return shape_fingerprint(JobState)


def encode_record(job: JobState) -> tuple[bytes, dict[str, str]]:
    """A record's body and headers (defaults left out, as snapshots do)."""
    body = job_codec().serializer.to_json(job, warnings="error", exclude_defaults=True)
    return body, {KIND_HEADER: "record", SHAPE_HEADER: record_shape()}


def encode_gone(gone: Gone) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"job_id": gone.job_id, "seq": gone.seq}).encode()
    return body, {KIND_HEADER: "gone"}


def encode_position(seq: int) -> tuple[bytes, dict[str, str]]:
    return json.dumps({"seq": seq}).encode(), {KIND_HEADER: "position"}


def decode_record(body: bytes, headers: dict[str, str]) -> JobState:
    shape = headers.get(SHAPE_HEADER)
    if shape != record_shape():
        raise RecordError(f"record of shape {shape!r}, this version reads {record_shape()!r}")
    try:
        job = job_codec().validator.validate_json(body)
    except ValidationError as exc:
        raise RecordError(f"damaged record: {exc.error_count()} error(s)") from None
    if not isinstance(job, JobState):
        raise RecordError("a record that is not a job")
    return job


def decode_seq(body: bytes) -> int:
    """The sequence of a tombstone or a position."""
    try:
        seq = json.loads(body)["seq"]
    except (ValueError, KeyError, TypeError):
        raise RecordError("damaged tombstone or position") from None
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise RecordError(f"bad sequence {seq!r}")
    return seq
