"""A world that plays random actions into a log, checking every invariant after every
event and that every decision the services make is applied."""

from __future__ import annotations

import copy

from gpuloom.decide.accounting import decide_charges
from gpuloom.decide.admission import decide_admission
from gpuloom.decide.explain import NEXT_CYCLE, Shared, explain
from gpuloom.decide.inventory import Heard, decide_inventory
from gpuloom.decide.queueing import decide_queue
from gpuloom.events import (
    Decision,
    Event,
    JobAdmitted,
    JobCancelled,
    JobCancelRequested,
    JobFinished,
    JobPlaced,
    JobPreempted,
    JobQueued,
    JobRejected,
    JobReserved,
    JobStarted,
    JobSubmitted,
    NodeLost,
    NodeRecovered,
    NodeRegistered,
    QueuePolicySet,
    UsageCharged,
    decode,
    encode,
)
from gpuloom.placement import FGD, BestFit, IndexCache, node_views, placement_cycle
from gpuloom.placement.holdings import HeldSum, release_all, scratch
from gpuloom.placement.incremental.holdings import KeptHoldings
from gpuloom.placement.incremental.queue import KeptQueue
from gpuloom.placement.inputs import holdings_of
from gpuloom.queueing.order import queue_order
from gpuloom.state import ClusterState, apply, fold
from gpuloom.state.lifecycle import LIFECYCLE
from gpuloom.state.nodeview import (
    NodeView,
    Record,
    changed_since,
    decode_record,
    encode_record,
    everything,
    hosts,
    route,
)
from gpuloom.testing.builders import LogBuilder, make_job_spec

from .actions import (
    INVENTORY_TIMEOUT,
    NODES,
    RANDOM_POLICY,
    AgentTurn,
    Charge,
    InventoryTurn,
    NodeChange,
    Noise,
    RequestCancel,
    Schedule,
    Submit,
    node_spec,
)
from .checks import check_invariants


def assert_kept_holdings(kept: KeptHoldings, state: ClusterState) -> None:
    """What `kept` gives is `holdings_of(state)`: as one list, and split by whether they
    end (those with a time limit, and the others summed as if summed afresh); and the
    jobs that preempted a job still on a node."""
    fresh = holdings_of(state)
    assert kept.of(state) == fresh, "a kept holding"
    timed, unbounded = kept.by_end(state)
    assert sorted(timed, key=lambda h: h.job_id) == sorted(
        (h for h in fresh if h.ends_at is not None), key=lambda h: h.job_id
    ), "a kept holding with an end"
    summed = HeldSum()
    for holding in fresh:
        if holding.ends_at is None:
            summed.add(holding)
    assert (unbounded.local, unbounded.spanning) == (summed.local, summed.spanning), "kept sum"
    preempted_for = {
        job.preempted_by
        for jobs in state.on_node.values()
        for job_id in jobs
        if (job := state.jobs[job_id]).preempted_by is not None
    }
    assert kept.awaiting(state) == preempted_for, "kept jobs awaiting their victims"


def assert_kept_queue(kept: KeptQueue, state: ClusterState) -> None:
    """What `kept` gives is `queue_order(state)`, job by job."""
    assert [job.job_id for job in kept.order(state)] == [
        job.job_id for job in queue_order(state)
    ], "the kept queue's order"


#: Who submits: the job's pick chooses (one account for all: quotas are not the point).
USERS = ("alice", "bob", "carol")


class Dispatch:
    """The dispatcher and one agent's view per node, as the services run them: routing
    every few events, the records through their bytes. Every node's view must hold
    exactly the jobs the fold puts on it, equal to the fold's."""

    def __init__(self) -> None:
        self.sent: dict[str, frozenset[str]] = {}
        self.routed: int | None = None
        self.views = {node: NodeView([node]) for node in NODES}

    def route_and_check(self, state: ClusterState) -> None:
        changed = None if self.routed is None else changed_since(state, self.routed)
        for routed in route(
            state, everything(state, self.sent) if changed is None else changed, self.sent
        ):
            view = self.views[routed.node]
            if isinstance(routed, Record):
                body, headers = encode_record(routed.job)
                view.take(routed.node, decode_record(body, headers))
            else:
                view.drop(routed.node, routed.job_id, routed.seq)
        self.routed = state.seq
        for node, view in self.views.items():
            view.advance(node, state.seq)
            assert view.state.seq == state.seq and view.complete(node, state.seq)
            expected = {j for j, job in state.jobs.items() if node in hosts(job)}
            assert set(view.state.on_node.get(node, ())) == expected, node
            assert set(view.state.jobs) == expected, node
            for job_id in expected:
                assert view.state.jobs[job_id] == state.jobs[job_id], job_id


def assert_released(cache: IndexCache, state: ClusterState) -> None:
    """The cache's views with everything running given back are those `release_all` of
    every holding makes of a copy of its index (kept only while no replica spans nodes)."""
    released = cache.released(state)
    if released is None:
        assert cache._index is None or any(
            len({r.host, *(p.node for p in r.slices)}) > 1
            for h in holdings_of(state)
            for r in h.replicas
        ), "nothing kept, and no replica spans nodes"
        return
    assert cache._index is not None
    fresh = scratch(cache._index)
    release_all(fresh, holdings_of(state))
    assert released.nodes == fresh.nodes, "a view with everything given back"


class World:
    def __init__(
        self,
        models: list[str],
        gpus: int,
        victims_yield: bool = True,
        backfill_depth: int | None = None,
        fair_queuing: bool = False,
    ) -> None:
        self.log = LogBuilder()
        self.state = ClusterState()
        #: Policies that keep their node index between this world's cycles.
        self.kept = [(BestFit(), IndexCache()), (FGD(), IndexCache())]
        #: What explaining kept from pass to pass, as the gateway keeps it.
        self.explaining = (BestFit(), IndexCache())
        #: An index cache that never decides: its views follow the fold's stamps alone.
        self.watching = IndexCache()
        #: Kept holdings that look only now and then (after every 5th event), so that
        #: several changes (a job preempted and placed again, say) come between looks.
        self.glancing = KeptHoldings()
        self.glancing_queue = KeptQueue()
        #: Nodes' views, routed after every 3rd event.
        self.dispatch = Dispatch()
        self.record(
            QueuePolicySet(
                victims_yield=victims_yield,
                backfill_depth=backfill_depth,
                fair_queuing=fair_queuing,
            )
        )
        for name, model in zip(NODES, models, strict=False):
            self.record(NodeRegistered(node=name, spec=node_spec(name, gpus, model)))

    def record(self, event: Event, after: float | None = None) -> bool:
        """Append and fold one event, check every invariant; True when it was applied."""
        before = {job_id: job.phase for job_id, job in self.state.jobs.items()}
        folded = apply(self.state, self.log.append(event, after=after))
        check_invariants(self.state, len(self.log))
        if folded.applied:
            check_lifecycle(type(event).__name__, before, self.state)
        views = self.watching.views_of(self.state)
        assert views == node_views(self.state), "a kept view the fold did not stamp as changed"
        if views:
            self.watching.index_for(views, self.kept[0][0], None)
            assert_released(self.watching, self.state)
        assert_kept_holdings(self.watching.holdings, self.state)
        assert_kept_queue(self.watching.queue, self.state)
        if len(self.log) % 5 == 0:
            assert_kept_holdings(self.glancing, self.state)
            assert_kept_queue(self.glancing_queue, self.state)
        if len(self.log) % 3 == 0:
            self.dispatch.route_and_check(self.state)
        return folded.applied

    def record_valid(self, decisions: list[Decision], after: float | None = None) -> None:
        for decision in decisions:
            assert self.record(decision.event, after), self.state.recent_voided[-1]

    def jobs_in(self, *phases: str) -> list[str]:
        return sorted(j for j, job in self.state.jobs.items() if job.phase in phases)

    def pick_job(self, pick: int) -> str:
        """Mostly a job that is not final yet, sometimes any job or an unknown one."""
        live = sorted(j for j, job in self.state.jobs.items() if not job.is_final)
        known = sorted([*self.state.jobs, *self.state.tombstones])  # ended and forgotten too
        pool = live if live and pick % 4 else [*known, "ghost"]
        return pool[(pick // 4) % len(pool)]

    def play(self, action: object) -> None:
        match action:
            case NodeChange():
                self.node_change(action)
            case Submit():
                job_id = self.pick_job(action.pick) if action.reuse_id else f"j{len(self.log)}"
                spec = make_job_spec(
                    action.gpus,
                    user=USERS[action.pick % len(USERS)],  # fair queuing has them take turns
                    gpu_model=action.models,
                    priority=action.priority,
                    preemptible=action.preemptible,
                )
                self.record(JobSubmitted(job_id=job_id, spec=spec, idempotency_key=action.key))
            case RequestCancel():
                self.record(JobCancelRequested(job_id=self.pick_job(action.pick)))
            case Schedule():
                self.schedule(action.services)
            case AgentTurn():
                self.agent_turn(action)
            case Charge():
                self.record_valid(decide_charges(self.state), after=action.seconds)
            case InventoryTurn():
                self.inventory_turn(action)
            case Noise():
                self.record(self.noise(action))

    def node_change(self, action: NodeChange) -> None:
        if action.kind == "register":
            name = NODES[action.pick % len(NODES)]
            spec = node_spec(name, action.gpus, action.model)
            self.record(NodeRegistered(node=name, spec=spec))
            return
        wanted = "ready" if action.kind == "lose" else "lost"
        fitting = sorted(n for n, node in self.state.nodes.items() if node.phase == wanted)
        busy = [n for n in fitting if self.state.on_node.get(n)]
        if busy and action.kind == "lose" and action.pick % 2:
            fitting = busy
        names = fitting if fitting and action.sensible else [*NODES, "n9"]
        name = names[action.pick % len(names)]
        lost = action.kind == "lose"
        self.record(NodeLost(node=name, reason="silent") if lost else NodeRecovered(node=name))

    def schedule(self, services: int = 3) -> None:
        self.record_valid(decide_admission(self.state))
        if services >= 2:
            self.record_valid(decide_queue(self.state))
        if services >= 3:
            self.place()

    def place(self) -> None:
        decisions = placement_cycle(self.state, BestFit())
        basis = self.state.seq
        for position, decision in enumerate(decisions):
            assert isinstance(decision.event, (JobPlaced, JobReserved, JobPreempted))
            assert (decision.event.basis_seq, decision.event.cycle_position) == (basis, position)
        assert placement_cycle(self.state, BestFit()) == decisions, "the audit property"
        for policy, kept in self.kept:  # an index kept from cycle to cycle decides the same
            fresh = type(policy)()
            assert placement_cycle(self.state, policy, kept=kept) == placement_cycle(
                self.state, fresh
            ), policy.name
        self.check_explain(decisions)
        self.record_valid(decisions)

    def check_explain(self, decisions: list[Decision]) -> None:
        """Explain is the pass: a queued job it says the next cycle places is one the
        cycle places (and no other), and a kept explainer says what a fresh one says."""
        placed = {d.event.job_id for d in decisions if isinstance(d.event, JobPlaced)}
        queued = sorted(self.state.queued)
        policy, kept = self.explaining
        shared = Shared(self.state, policy, kept=kept, wanted=frozenset(queued[:5]))
        for job_id in queued:
            fresh = explain(self.state, job_id, brief=True)
            assert fresh is not None and fresh.reason is not None
            if fresh.reason != "Dependency" and not self.state.jobs[job_id].cancel_requested:
                assert (fresh.detail or "").startswith(NEXT_CYCLE) == (job_id in placed), (
                    job_id,
                    fresh,
                )
            again = explain(self.state, job_id, brief=True, shared=shared)
            assert again == fresh, (job_id, again, fresh)

    def agent_turn(self, action: AgentTurn) -> None:
        if not self.jobs_in("placed", "running"):
            self.schedule()
        on_nodes = self.jobs_in("placed", "running")
        if not on_nodes:
            return
        job = self.state.jobs[on_nodes[action.pick % len(on_nodes)]]
        assert job.node is not None
        event: Event
        if job.phase == "placed" and action.start:
            event = JobStarted(job_id=job.job_id, attempt=job.attempt, node=job.node)
        else:  # a job told to stop for another ends preempted, as its agent reports it
            event = JobFinished(
                job_id=job.job_id,
                attempt=job.attempt,
                node=job.node,
                outcome="preempted" if job.preempted_by is not None else action.outcome,
            )
        self.record_valid([Decision(event, "agent")], after=action.seconds)

    def inventory_turn(self, action: InventoryTurn) -> None:
        now = self.log.next_at()
        heard = {}
        for i, name in enumerate(NODES):
            node = self.state.nodes.get(name)
            if action.silent[i] or (node is None and i != action.changed):
                continue
            spec = node.spec if node and i != action.changed else None
            heard[name] = Heard(now, spec or node_spec(name, action.gpus, action.model))
        decisions = decide_inventory(
            self.state, heard, now, INVENTORY_TIMEOUT, self.log[0].envelope.at
        )
        for decision in decisions:
            applied = self.record(decision.event)
            # decide_inventory proposes only what the fold accepts.
            assert applied, decision.event

    def noise(self, action: Noise) -> Event:
        job_id = self.pick_job(action.pick)
        queued = self.jobs_in("queued")
        if action.kind == "place" and queued and action.pick % 3:
            job_id = queued[action.pick % len(queued)]
        job = self.state.jobs.get(job_id)
        attempt = max(1, (job.attempt if job else 1) + action.shift)
        node = job.node if job and job.node and action.shift == 0 else action.node
        match action.kind:
            case "admit":
                return JobAdmitted(job_id=job_id)
            case "reject":
                return JobRejected(job_id=job_id, reason="random")
            case "queue":
                return JobQueued(job_id=job_id, priority=action.shift)
            case "place":
                return self.random_placement(
                    action, job_id, (job.attempt if job else 0) + 1 + action.shift
                )
            case "steal":
                return self.stealing_placement(action) or JobAdmitted(job_id=job_id)
            case "start":
                return JobStarted(job_id=job_id, attempt=attempt, node=node)
            case "finish":
                return JobFinished(job_id=job_id, attempt=attempt, node=node, outcome="failed")
            case "cancel":
                return JobCancelled(job_id=job_id)
            case _:
                return UsageCharged(
                    job_id=job_id,
                    attempt=attempt,
                    user="u",
                    account="a",
                    gpus=1,
                    seconds=1,
                    gpu_milli_seconds=1000,
                )

    def stealing_placement(self, action: Noise) -> JobPlaced | None:
        """A queued job placed on the GPUs of a job on a node, as a placement decided
        on a stale state would do (admission and queue take a turn first if no job with
        GPUs is queued)."""
        if not any(self.state.jobs[j].spec.gpus for j in self.jobs_in("queued")):
            self.schedule(services=2)
        thieves = [j for j in self.jobs_in("queued") if self.state.jobs[j].spec.gpus]
        victims = self.jobs_in("placed", "running")
        if not thieves or not victims:
            return None
        thief = self.state.jobs[thieves[action.pick % len(thieves)]]
        victim = self.state.jobs[victims[action.pick % len(victims)]]
        assert victim.node is not None
        node = self.state.nodes[victim.node]
        indexes = list(dict.fromkeys([*victim.gpu_indexes, *sorted(node.gpus)]))
        indexes = indexes[: thief.spec.gpus]
        return JobPlaced(
            job_id=thief.job_id,
            attempt=thief.attempt + 1,
            node=node.name,
            gpu_indexes=indexes,
            gpu_uuids=[node.gpus[i].uuid for i in indexes],
            basis_seq=max(0, self.state.seq - 10),
            cycle_position=0,
            policy=RANDOM_POLICY,
        )

    def random_placement(self, action: Noise, job_id: str, attempt: int) -> JobPlaced:
        """Often on a busy node and with as many GPUs as the job asks for, held ones first."""
        name = action.node
        busy = sorted(n for n, jobs in self.state.on_node.items() if jobs)
        if busy and action.pick % 4 == 1:
            name = busy[action.pick % len(busy)]
        node = self.state.nodes.get(name)
        job = self.state.jobs.get(job_id)
        indexes = list(action.gpu_indexes)
        if job is not None and node is not None and action.pick % 2:
            held = [i for i, gpu in sorted(node.gpus.items()) if gpu.job_id is not None]
            candidates = [*held, *indexes, *sorted(node.gpus)]
            indexes = list(dict.fromkeys(candidates))[: job.spec.gpus]
        uuids = [node.gpus[i].uuid if node and i in node.gpus else f"GPU-{i}" for i in indexes]
        if uuids and action.corrupt_uuid:
            uuids[0] = "GPU-wrong"
        return JobPlaced(
            job_id=job_id,
            attempt=max(1, attempt),
            node=name,
            gpu_indexes=indexes,
            gpu_uuids=uuids,
            basis_seq=self.state.seq,
            cycle_position=0,
            policy=RANDOM_POLICY,
        )

    def check_replay(self) -> None:
        records = self.log.records
        assert fold(records) == self.state, "a fresh fold equals the incremental one"
        for k in sorted({0, len(records) // 3, len(records) // 2, len(records) - 1}):
            assert fold(records[k:], fold(records[:k])) == self.state, f"snapshot at {k}"
        read_back = [decode(r.seq, encode(r.envelope)) for r in records]
        assert fold(read_back) == self.state, "the log read back from the wire folds the same"
        assert copy.deepcopy(self.state) == self.state


def check_lifecycle(event_type: str, before: dict[str, str], state: ClusterState) -> None:
    """Every job an applied event moved went along `LIFECYCLE`: from a phase the event's
    step may find it in (a new job: a step that makes jobs) to one it may leave it in."""
    step = LIFECYCLE.get(event_type)
    for job_id, job in state.jobs.items():
        was = before.get(job_id)
        if was == job.phase:
            continue
        assert step is not None, f"{event_type} moved {job_id} from {was} to {job.phase}"
        if was is None:
            assert not step.source, f"{event_type} made job {job_id}"
        else:
            assert was in step.source, f"{event_type} found {job_id} {was}"
        assert job.phase in step.target, f"{event_type} left {job_id} {job.phase}"
