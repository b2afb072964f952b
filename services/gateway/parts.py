"""The parts of one gateway, held by its app (`app.state.gateway`): settings, the bus
(None while NATS is away), SQL sessions, the read model (the gateway's fold and how far
the SQL rows reach), and what requests share (write marks, streams, budgets, caches).

Routes reach them through the dependencies of `services.gateway.deps`; the fold and
the rows only through the read facade, `services.gateway.reads`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gpuloom.auth import TokenVerifier
from gpuloom.bus import EventBus
from gpuloom.config import Settings
from gpuloom.events import JobSpec
from gpuloom.placement.inputs import request_of
from gpuloom.state import ClusterState
from gpuloom.store.inline import ReadSessions
from services.gateway.readiness import Readiness
from services.gateway.readmodel import ReadModel
from services.gateway.stream import Streams
from services.gateway.stream_budget import StreamBudget


@dataclass
class Gateway:
    settings: Settings
    sessions: ReadSessions
    bus: EventBus | None = None
    read_model: ReadModel | None = None
    #: Checks bearer tokens; None: authentication is off (every request an operator).
    verifier: TokenVerifier | None = None
    #: The last sequence this gateway wrote for each caller (read-your-writes).
    writes: WriteMarks = field(default_factory=lambda: WriteMarks())
    #: The log's last sequence when the gateway connected: until the projection has
    #: written that far, its answers are stale (`services.gateway.freshness`).
    start_seq: int = 0
    #: What the streams of `GET /v1/events` share: each event decoded once, the hub.
    streams: Streams = field(default_factory=Streams)
    #: How many streams and replays each user and everyone may hold (`create_app` sets it).
    stream_budget: StreamBudget = field(default_factory=StreamBudget)
    #: `resources_problem`'s answers by request shape, while the nodes stay the same.
    feasibility: Feasibility = field(default_factory=lambda: Feasibility())
    #: /readyz's lag samples (`services.gateway.readiness`), from the settings.
    readiness: Readiness = field(init=False)

    def __post_init__(self) -> None:
        self.readiness = Readiness(self.settings.ready_max_lag, self.settings.ready_grace_s)


class WriteMarks:
    """The last sequence written for each caller, for read-your-writes. A caller is
    forgotten once a read of theirs finds their writes in the read model; past `MOST`
    callers, the oldest marks are dropped (those callers' reads may then miss their
    latest write for as long as the read model lags, never more)."""

    MOST = 10_000

    def __init__(self) -> None:
        self._last: dict[str, int] = {}
        #: The last sequence written for anyone.
        self.latest = 0

    def wrote(self, caller: str, seq: int) -> None:
        previous = self._last.pop(caller, 0)  # re-inserted last: the dict is oldest first
        self._last[caller] = max(seq, previous)
        self.latest = max(self.latest, seq)
        while len(self._last) > self.MOST:
            del self._last[next(iter(self._last))]

    def last(self, caller: str) -> int:
        return self._last.get(caller, 0)

    def reached(self, caller: str, seq: int) -> None:
        """The read model includes `caller`'s writes if they are at or below `seq`."""
        if self._last.get(caller, seq + 1) <= seq:
            del self._last[caller]


Refusal = tuple[str | None, str] | None


class Feasibility:
    """`resources_problem`'s answers, remembered by request shape (`request_of`) for as
    long as the nodes are the same: their names, specs and GPU pools are all it reads
    of the state, so the same shape on the same nodes gets the same answer. Building
    views of every node and placing on them cost a third of a submission's CPU."""

    MOST = 1024  #: shapes remembered at once (a burst of distinct shapes starts over)

    def __init__(self) -> None:
        self._nodes: object = None
        self._answers: dict[object, Refusal] = {}

    def answer(
        self, state: ClusterState, spec: JobSpec, judge: Callable[[ClusterState, JobSpec], Refusal]
    ) -> Refusal:
        nodes = tuple(
            (name, node.spec.fingerprint, tuple(gpu.pool for _, gpu in sorted(node.gpus.items())))
            for name, node in sorted(state.nodes.items())
        )
        if nodes != self._nodes or len(self._answers) >= self.MOST:
            self._nodes, self._answers = nodes, {}
        shape = request_of(spec)
        if shape not in self._answers:
            self._answers[shape] = judge(state, spec)
        return self._answers[shape]
