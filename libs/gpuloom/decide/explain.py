"""Why is my job pending? The scheduler's own answer, read from a pass it would make now.

For a pending job: a reason code, its position in the queue and the jobs ahead of it,
for every node the first rule that keeps the job off it, and an estimate of when it
could start, from the time limits of the jobs running now.

Before the queue: `Held` (a cancel is pending), `Dependency` (a job it depends on has
not ended: `gpuloom.state.dependencies`), `Priority` (admission and the queue have not
answered it yet). A queued job's reason is what the reference placement pass says of it
(`gpuloom.placement.scheduling`, run here on the state as it is: its `Waiting`), so
explain keeps no rule of its own: `QuotaExceeded`, `AssocGrpGRES`, `Resources`,
`Reservation` and `Priority` mean what `gpuloom.placement.outcomes` says. A job the
pass would place now is `Priority` too: the next placement cycle places it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime

from gpuloom.placement.cycle import earliest_start
from gpuloom.placement.engine import Policy
from gpuloom.placement.filters import verdict
from gpuloom.placement.incremental.index_cache import IndexCache
from gpuloom.placement.inputs import from_ms, node_views, pass_inputs, request_of, rules_of
from gpuloom.placement.outcomes import Placed, Waiting
from gpuloom.placement.policies import BestFit
from gpuloom.placement.reservation import Reservation
from gpuloom.placement.scheduling import SchedulingPass
from gpuloom.queueing.order import queue_order, yields_to
from gpuloom.state import ClusterState, JobState
from gpuloom.state.dependencies import dependency_status
from gpuloom.state.model import NodeState

AHEAD_SHOWN = 20
#: What a queued job the pass would place now waits for.
NEXT_CYCLE = "a node has room for it now: the next placement cycle places it"
#: What every queued job waits for while no node is ready and uncordoned.
NO_NODE = "no node has room for it now: none is ready and open to new work"


@dataclass(frozen=True)
class Explanation:
    job_id: str
    state: str
    reason: str | None
    detail: str | None = None
    position: int | None = None
    ahead: list[str] = field(default_factory=list)
    nodes: dict[str, str] = field(default_factory=dict)
    estimated_start: datetime | None = None


@dataclass
class Shared:
    """One pass over the queue, made on first use and read for every job explained on
    the same state (the job list explains each pending job of its page).

    `wanted`: the jobs that will be asked about; the pass stops once it has decided them
    (a job near the head of a long queue costs a short walk). `kept`: what the last pass
    read, kept for the next (the fast twin's inputs, `IndexCache.pass_inputs`: the same
    answers, re-read only where the log changed; a process that explains again and
    again, the gateway, keeps one).
    """

    state: ClusterState
    policy: Policy = field(default_factory=BestFit)
    kept: IndexCache | None = None
    wanted: frozenset[str] | None = None
    _waiting: dict[str, Waiting] | None = None
    _placed: frozenset[str] = frozenset()
    _reservation: Reservation | None = None
    #: What a job the pass did not meet waits for: where it stopped, or that no node
    #: takes work at all.
    _unmet: Waiting | None = None

    def waits(self, job_id: str) -> Waiting | None:
        """Why the pass would leave `job_id` waiting; None when it would place it."""
        if self._waiting is None or not self._decided(job_id):
            self._run(job_id)
        assert self._waiting is not None
        if job_id in self._placed:
            return None
        if job_id in self._waiting:
            return self._waiting[job_id]
        unmet = self._unmet or Waiting(job_id, "Priority", "job(s) ahead in the queue")
        return replace(unmet, job_id=job_id)

    def reservation(self, job_id: str) -> Reservation | None:
        """The reservation the pass holds once it has decided `job_id` (made or kept)."""
        if self._waiting is None or not self._decided(job_id):
            self._run(job_id)
        return self._reservation

    def _decided(self, job_id: str) -> bool:
        return self.wanted is None or job_id in self.wanted

    def _run(self, job_id: str) -> None:
        if self.wanted is not None and job_id not in self.wanted:
            self.wanted = self.wanted | {job_id} if self._waiting is None else None
        if self.kept is None:
            inputs = pass_inputs(self.state, self.policy)
        else:
            inputs = self.kept.pass_inputs(self.state, self.policy)
        self._waiting = {}
        if inputs is None:  # no node takes work: the placement cycle makes no pass at all
            self._unmet = Waiting("", "Resources", NO_NODE)
            return
        rules = rules_of(self.state)
        walk = SchedulingPass(inputs, self.policy, rules, until=self.wanted)
        outcomes = walk.run(inputs.candidates)
        self._waiting = {o.job_id: o for o in outcomes if isinstance(o, Waiting)}
        self._placed = frozenset(o.candidate.job_id for o in outcomes if isinstance(o, Placed))
        self._reservation = walk.reservation
        if walk.stopped is not None:
            self._unmet = Waiting("", "Priority", walk.stopped)


def reason_text(code: str | None, detail: str | None) -> str | None:
    """`Code: detail`, with the code once: a detail that already starts with its code
    (`Dependency: waiting for ...`) is shown as it is."""
    if code is None:
        return detail
    if not detail:
        return code
    return detail if detail.startswith(code) else f"{code}: {detail}"


def explain(
    state: ClusterState,
    job_id: str,
    brief: bool = False,
    policy: Policy | None = None,
    shared: Shared | None = None,
) -> Explanation | None:
    """Why `job_id` is pending (see the module doc). `brief`: the reason code and detail
    only, for `GET /v1/jobs/{id}`, which clients poll, and the job list.

    The pass runs with `policy` (default best fit: which nodes it picks, not whether a
    job fits, depends on it); each node's verdict is the placement filters'
    (`gpuloom.placement.filters`) and the estimate the pass's reservation, else the
    scheduler's reservation search for this job alone (`earliest_start`)."""
    job = state.jobs.get(job_id)
    if job is None:
        ended = state.tombstones.get(job_id)  # ended and forgotten (retention.py)
        return Explanation(job_id, ended.phase, None, None) if ended is not None else None
    if job.phase not in ("submitted", "admitted", "queued"):
        return Explanation(job_id, job.phase, None, job.reason)
    if job.cancel_requested:
        return Explanation(job_id, job.phase, "Held", "a cancel request is being carried out")
    if job.spec.depends_on:
        status, why = dependency_status(state, job.spec.depends_on)
        if status != "met":
            return Explanation(job_id, job.phase, "Dependency", why)
    if job.phase != "queued":
        return Explanation(job_id, job.phase, "Priority", "admission and queueing are pending")
    if shared is None or shared.state is not state:
        shared = Shared(state, policy or BestFit(), wanted=frozenset({job_id}))
    waiting = shared.waits(job_id)
    reason, detail = ("Priority", NEXT_CYCLE) if waiting is None else (waiting.code, waiting.detail)
    if brief:
        return _yielding(state, job, Explanation(job_id, job.phase, reason, detail))
    order = [j.job_id for j in queue_order(state)]
    position = order.index(job_id) + 1 if job_id in order else None
    ahead = order[: (position or 1) - 1][:AHEAD_SHOWN]
    reserved = shared.reservation(job_id)
    estimate: datetime | None = None
    if reserved is not None and reason in ("Resources", "Topology", "Reservation"):
        start = reserved.start_at
        when = f"at {from_ms(start).isoformat()}" if start is not None else None
        if reserved.job_id == job_id:
            estimate = from_ms(start) if start is not None else None
            detail += f" to start {when}" if when else " until jobs without a time limit end"
        elif reason == "Reservation" and detail.startswith("it would delay"):
            hosts = ", ".join(sorted({r.host for r in reserved.replicas}))
            detail += f" (it starts {when or 'when jobs without a time limit end'} on {hosts})"
    if reason == "Priority" and waiting is not None:
        said = "" if "ahead in the queue" in detail else f"; {detail}"
        detail = f"{len(ahead)} job(s) ahead in the queue{said}"
    if reason in ("Resources", "Topology") and estimate is None:
        estimate = earliest_start(state, job, policy or BestFit())
    found = Explanation(
        job_id, job.phase, reason, detail, position, ahead, _verdicts(state, job), estimate
    )
    return _yielding(state, job, found)


def _verdicts(state: ClusterState, job: JobState) -> dict[str, str]:
    """Each node's verdict on the job, lost and cordoned ones included."""
    request = request_of(job.spec)
    current = {v.name: v for v in node_views(state, include_lost=True)}
    idle = {v.name: v for v in node_views(state, idle=True, include_lost=True)}
    return {
        name: verdict(
            request,
            current[name],
            idle[name],
            ready=state.nodes[name].phase == "ready",
            cordoned=state.nodes[name].cordon_reason if state.nodes[name].cordoned else None,
            out_of_service=_out_of_service(state.nodes[name]),
        )
        for name in sorted(current)
    }


def _out_of_service(node: NodeState) -> str | None:
    """The node's failed GPUs as explain names them: `GPU 2 failed (xid: Xid 79 ...)`."""
    if not node.unhealthy:
        return None
    return "; ".join(
        f"GPU {index} failed ({fault.text})" for index, fault in sorted(node.unhealthy.items())
    )


def _yielding(state: ClusterState, job: JobState, found: Explanation) -> Explanation:
    """`found`, saying also that the job ranks behind the job it was preempted for
    (`QueuePolicySet.victims_yield`), while that one waits: its points alone would
    not explain its place."""
    preemptor = yields_to(state, job)
    if preemptor is None:
        return found
    said = f"it yields to {preemptor}, which it was preempted for and which goes first"
    return replace(found, detail=f"{found.detail}; {said}" if found.detail else said)
