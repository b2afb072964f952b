"""Topology in requests (docs/topology.md): a required gang stays inside one domain of
its level or waits with a reason naming what each domain has; among the domains that
fit, the tightest; a preferred gang spreads only when no domain fits; the fold voids a
recorded placement that crosses domains of a required level."""

from __future__ import annotations

from gpuloom.events import NodeRegistered, ReplicaAssignment, SliceRef, TopologyPlace
from gpuloom.events.jobs import TopologyRequest
from gpuloom.placement import BestFit, placement_cycle
from gpuloom.placement.inputs import pass_inputs, rules_of
from gpuloom.placement.outcomes import Waiting
from gpuloom.placement.scheduling import schedule
from gpuloom.state import ClusterState
from gpuloom.state.rules.assignment import assignment_problem
from gpuloom.testing.builders import LogBuilder, make_job_spec, make_node

RACKS = {"a1": "r1", "a2": "r1", "b1": "r2"}


def cluster(gpus: int = 4) -> LogBuilder:
    """Three nodes of `gpus` GPUs: a1 and a2 in rack r1, b1 in rack r2 (each its own
    NVLink domain)."""
    log = LogBuilder()
    for name, rack in RACKS.items():
        node = make_node(name, gpus)
        topology = [
            TopologyPlace(level="nvlink", domain=f"nvl-{name}"),
            TopologyPlace(level="rack", domain=rack),
        ]
        spec = node.spec.model_copy(update={"topology": topology})
        log.append(NodeRegistered(node=name, spec=spec))
    return log


def gang(replicas: int, gpus: int, level: str = "rack", mode: str = "required") -> dict:  # type: ignore[type-arg]
    return {
        "gpus": gpus,
        "replicas": replicas,
        "topology": TopologyRequest(level=level, mode=mode),  # type: ignore[arg-type]
    }


def hosts_of(state: ClusterState, job_id: str) -> set[str]:
    job = state.jobs[job_id]
    return {r.host for r in job.replicas} | {p.node for r in job.replicas for p in r.slices}


def cycle(log: LogBuilder) -> ClusterState:
    log.record_decisions(placement_cycle(log.state(), BestFit()))
    return log.state()


def waiting(state: ClusterState, job_id: str) -> Waiting:
    inputs = pass_inputs(state, BestFit())
    assert inputs is not None
    [found] = [
        o
        for o in schedule(inputs, BestFit(), rules_of(state))
        if isinstance(o, Waiting) and o.job_id == job_id
    ]
    return found


def test_a_required_gang_waits_while_only_split_room_exists_then_starts_in_one_rack() -> None:
    log = cluster()
    log.run_to_queue("busy", gpus=2)
    log.place("busy", "a1", [0, 1])  # r1 has 6 free GPUs, r2 has 4
    log.run_to_queue("g", **gang(2, 4))
    state = cycle(log)
    assert state.jobs["g"].phase == "queued", "8 GPUs free, but no rack has 8"
    found = waiting(state, "g")
    assert found.code == "Topology"
    assert "no rack has 8 free GPU(s) for it: r1 has 6, r2 has 4" in found.detail
    log.finish("busy", "a1")
    state = cycle(log)
    assert state.jobs["g"].phase == "placed"
    assert hosts_of(state, "g") == {"a1", "a2"}


def test_among_the_domains_that_fit_the_tightest_is_taken_and_the_emptiest_kept_whole() -> None:
    log = cluster()
    log.run_to_queue("g", **gang(2, 2))  # fits in r1 (8 free) and in r2 (4 free)
    state = cycle(log)
    assert hosts_of(state, "g") == {"b1"}, "r1 stays whole for a gang of 8"
    log.run_to_queue("big", **gang(2, 4))
    state = cycle(log)
    assert hosts_of(state, "big") == {"a1", "a2"}


def test_one_replica_on_its_own_node_is_placed_by_the_policy_alone() -> None:
    """A job of one replica whose GPUs are on its host is inside one domain of every level
    wherever it lands: no domain is tried (that would cost every node once per domain,
    for each such job a user submits)."""
    log = cluster()
    log.run_to_queue("one", **gang(1, 4))
    log.run_to_queue("plain", gpus=4)
    state = cycle(log)
    assert hosts_of(state, "one") == {"a1"} and hosts_of(state, "plain") == {"a2"}


def test_a_preferred_gang_stays_inside_a_domain_while_one_fits() -> None:
    log = cluster()
    log.run_to_queue("busy", gpus=2)
    log.place("busy", "a1", [0, 1])  # r1 has 6 free, r2 has 4
    log.run_to_queue("near", **gang(2, 2, mode="preferred"))
    state = cycle(log)
    assert hosts_of(state, "near") == {"b1"}, "r2 fits it most tightly"
    log.run_to_queue("far", **gang(2, 2, mode="preferred"))
    state = cycle(log)
    assert {state.nodes[n].spec.domain("rack") for n in hosts_of(state, "far")} == {"r1"}


def test_a_preferred_gang_that_fits_no_domain_spreads_over_few() -> None:
    log = cluster()
    log.run_to_queue("wide", **gang(3, 4, mode="preferred"))  # 12 GPUs: the whole cluster
    state = cycle(log)
    assert state.jobs["wide"].phase == "placed"
    assert hosts_of(state, "wide") == {"a1", "a2", "b1"}


def test_a_tighter_level_is_a_domain_of_its_own() -> None:
    log = cluster()
    log.run_to_queue("g", **gang(2, 2, level="nvlink"))  # 4 GPUs inside one NVLink domain
    state = cycle(log)
    assert len(hosts_of(state, "g")) == 1


def test_a_required_gang_no_domain_could_ever_hold_is_rejected_at_admission() -> None:
    from gpuloom.decide.admission import decide_admission

    log = cluster()
    log.submit("huge", **gang(3, 4))  # 12 GPUs: more than any rack has
    [decision] = decide_admission(log.state())
    assert type(decision.event).__name__ == "JobRejected"


def whole_gpus(state: ClusterState, host: str) -> ReplicaAssignment:
    gpus = state.nodes[host].gpus
    slices = [
        SliceRef(node=host, index=i, uuid=gpus[i].uuid, milli=1000, memory_mib=0) for i in gpus
    ]
    return ReplicaAssignment(host=host, slices=slices)


def test_the_fold_refuses_a_placement_of_a_required_gang_that_crosses_racks() -> None:
    state = cluster().state()
    spec = make_job_spec(4, replicas=2, topology=TopologyRequest(level="rack"))
    crossing = [whole_gpus(state, "a1"), whole_gpus(state, "b1")]
    problem = assignment_problem(state, spec, crossing)
    assert problem is not None and "span 2 rack domains (r1, r2)" in problem
    assert (
        assignment_problem(state, spec, [whole_gpus(state, "a1"), whole_gpus(state, "a2")]) is None
    )
    preferred = spec.model_copy(
        update={"topology": TopologyRequest(level="rack", mode="preferred")}
    )
    assert assignment_problem(state, preferred, crossing) is None, "preferred may span"


def test_a_request_naming_an_unknown_level_is_refused_naming_the_field() -> None:
    from gpuloom.decide.admission import resources_problem

    state = cluster().state()
    spec = make_job_spec(1, topology=TopologyRequest(level="block"))
    field, why = resources_problem(state, spec) or (None, "")
    assert field == "topology.level" and "levels in the cluster: nvlink, rack" in why
    spec = make_job_spec(4, replicas=3, topology=TopologyRequest(level="rack"))
    field, why = resources_problem(state, spec) or (None, "")
    assert field == "topology" and "no rack has 12 free GPU(s) for it: r1 has 8, r2 has 4" in why


def test_a_blocked_rack_gang_reserves_one_rack_and_backfill_keeps_off_it() -> None:
    """r1 (a1, a2) and r2 (b1), 4 GPUs each. a1 is busy for 100 s and b1 half busy for
    50 s: a gang of 2 x 4 GPUs that must be inside one rack can start only on r1, when
    a1 frees. It reserves a1 and a2; a long job then goes to b1, not onto the idle a2,
    while a short one, ending before the gang starts, may use a2 meanwhile."""
    from gpuloom.events import JobReserved, QueuePolicySet

    log = cluster()
    log.append(QueuePolicySet(backfill_depth=100))
    log.run_to_queue("a1-busy", gpus=4, time_limit_s=100, node_selector={})
    log.place("a1-busy", "a1", [0, 1, 2, 3])
    log.run_to_queue("b1-busy", gpus=2, time_limit_s=50)
    log.place("b1-busy", "b1", [0, 1])
    log.run_to_queue("gang", **gang(2, 4), time_limit_s=600)
    log.run_to_queue("long", gpus=2, time_limit_s=1000)
    log.run_to_queue("short", gpus=4, time_limit_s=10)
    decisions = placement_cycle(log.state(), BestFit())
    [reserved] = [d.event for d in decisions if isinstance(d.event, JobReserved)]
    assert reserved.job_id == "gang"
    assert {r.host for r in reserved.replicas} == {"a1", "a2"}, "one rack: r1"
    log.record_decisions(decisions)
    state = log.state()
    assert state.jobs["gang"].phase == "queued"
    assert hosts_of(state, "long") == {"b1"}, "it would outlast the gang's start on a2"
    assert hosts_of(state, "short") == {"a2"}, "it ends before the gang starts: it backfills"
