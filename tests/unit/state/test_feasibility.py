"""The fold and the engine judge a placement by one rule (`gpuloom.state.feasibility`):
a one-replica placement on a node is valid by the fold (`assignment_problem`) exactly
when the engine's rules (`host_fits`, `gpu_serves`) take it, both ways, on random nodes,
holders and requests."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gpuloom.events import GpuSpec, NodeRegistered, NodeSpec, ReplicaAssignment, SliceRef
from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.placement.inputs import node_view, request_of
from gpuloom.placement.resources import (
    gpu_serves,
    gpu_serves_by_rule,
    host_fits,
    host_fits_by_rule,
)
from gpuloom.state import ClusterState
from gpuloom.state.feasibility import HELD, gpu_kind_refusal, gpu_room_refusal, host_refusal
from gpuloom.state.rules.assignment import assignment_problem
from gpuloom.testing.builders import LogBuilder, make_job_spec

GPU_MEMORY = 40_960

gpus = st.lists(
    st.tuples(st.sampled_from(["A100", "T4"]), st.sampled_from(["physical", "vgpu"])),
    min_size=1,
    max_size=4,
)
#: What other jobs hold of each GPU: nothing, a whole GPU, or a share (vGPU only).
holdings = st.lists(st.sampled_from([0, 250, 750, MILLI_PER_GPU]), min_size=4, max_size=4)
specs = st.fixed_dictionaries(
    {
        "gpus": st.integers(1, 2),
        "gpu_milli": st.sampled_from([MILLI_PER_GPU, 250, 500]),
        "gpu_model": st.sampled_from([[], ["A100"], ["T4"]]),
        "pool": st.sampled_from(["any", "physical", "vgpu"]),
        "cpu_milli": st.sampled_from([0, 2000, 6000, 9000]),
        "memory_mib": st.sampled_from([0, 1000, 40_000, 70_000]),
        "node_selector": st.sampled_from([{}, {"zone": "a"}]),
        "image": st.sampled_from([None, "img:1"]),
    }
)
hosts = st.fixed_dictionaries(
    {
        "cpu_milli": st.sampled_from([0, 8000]),
        "memory_mib": st.sampled_from([0, 64_000]),
        "labels": st.sampled_from([{}, {"zone": "a"}, {"zone": "b"}]),
        "runtimes": st.sampled_from([[], ["podman"]]),
        "used": st.sampled_from([(0, 0), (4000, 0), (0, 32_000), (4000, 32_000)]),
    }
)


def node_state(kinds: list[tuple[str, str]], held: list[int], host: dict) -> ClusterState:  # type: ignore[type-arg]
    log = LogBuilder()
    spec = NodeSpec(
        gpus=[
            GpuSpec(index=i, uuid=f"n1-{i}", model=model, memory_mib=GPU_MEMORY, pool=pool)  # type: ignore[arg-type]
            for i, (model, pool) in enumerate(kinds)
        ],
        cpu_milli=host["cpu_milli"],
        memory_mib=host["memory_mib"],
        labels=host["labels"],
        runtimes=host["runtimes"],
    )
    log.append(NodeRegistered(node="n1", spec=spec))
    state = log.state()
    node = state.nodes["n1"]
    for index, gpu in node.gpus.items():  # what other jobs hold, as the fold records it
        milli = held[index] if gpu.pool == "vgpu" else held[index] // MILLI_PER_GPU * 1000
        if milli:
            gpu.holders[f"other{index}"] = (milli, gpu.slice_memory(milli, milli * 40))
    if host["used"] != (0, 0):  # CPU and memory of another job's replica
        node.hosted["other"] = host["used"]
    return state


@settings(max_examples=600, deadline=None)
@given(gpus, holdings, hosts, specs, st.randoms(use_true_random=False))
def test_the_fold_and_the_engine_take_the_same_placements(
    kinds: list[tuple[str, str]],
    held: list[int],
    host: dict,
    shape: dict,
    random: object,  # type: ignore[type-arg]
) -> None:
    if shape["gpu_milli"] == MILLI_PER_GPU:
        shape = {**shape, "gpu_milli": None}
    assume(shape["gpu_milli"] is None or shape["pool"] != "physical")  # no such JobSpec
    spec = make_job_spec(**shape)
    state = node_state(kinds, held, host)
    node = state.nodes["n1"]
    if spec.gpus > len(node.gpus):
        return
    chosen = random.sample(sorted(node.gpus), spec.gpus)  # type: ignore[attr-defined]
    view = node_view(node, 0)
    request = request_of(spec)
    by_index = {gpu.index: gpu for gpu in view.gpus}
    slices = [
        SliceRef(
            node="n1",
            index=i,
            uuid=node.gpus[i].uuid,
            milli=spec.share_milli,
            memory_mib=request.memory_for(by_index[i]),
        )
        for i in chosen
    ]
    replica = ReplicaAssignment(
        host="n1", slices=slices, cpu_milli=spec.cpu_milli, memory_mib=spec.memory_mib
    )
    problem = assignment_problem(state, spec, [replica])
    engine = host_fits(request, view) and all(gpu_serves(request, by_index[i]) for i in chosen)
    assert (problem is None) == engine, problem
    # the engine's hot path is the rule written out: the same answer on every GPU and host
    assert host_fits(request, view) == host_fits_by_rule(request, view)
    for gpu in view.gpus:
        assert gpu_serves(request, gpu) == gpu_serves_by_rule(request, gpu), gpu


@given(
    held=st.sampled_from([(4000, 0), (0, 32_000)]),
    need=st.sampled_from([(6000, 0), (0, 40_000)]),
)
def test_what_another_replica_holds_on_the_host_counts_on_both_sides(
    held: tuple[int, int], need: tuple[int, int]
) -> None:
    """8,000 milli-CPU and 64,000 MiB, of which another job holds some: a replica that
    needs more than is left is refused by both, one that needs the rest taken by both."""
    host = {"cpu_milli": 8000, "memory_mib": 64_000, "labels": {}, "runtimes": [], "used": held}
    state = node_state([("A100", "physical")], [0, 0, 0, 0], host)
    spec = make_job_spec(0, cpu_milli=need[0], memory_mib=need[1])
    replica = ReplicaAssignment(host="n1", cpu_milli=need[0], memory_mib=need[1])
    problem = assignment_problem(state, spec, [replica])
    fits = host_fits(request_of(spec), node_view(state.nodes["n1"], 0))
    assert (problem is None) == fits
    assert fits == (held[0] + need[0] <= 8000 and held[1] + need[1] <= 64_000)


def test_the_rule_itself() -> None:
    """What both sides share is right on its own: a whole GPU with any share taken is
    held; a fraction needs its share and memory; a fraction never from physical."""
    assert gpu_room_refusal(MILLI_PER_GPU, GPU_MEMORY, 750, GPU_MEMORY, GPU_MEMORY) == HELD
    assert gpu_room_refusal(MILLI_PER_GPU, GPU_MEMORY, MILLI_PER_GPU, 100, GPU_MEMORY) == HELD
    assert (
        gpu_room_refusal(MILLI_PER_GPU, GPU_MEMORY, MILLI_PER_GPU, GPU_MEMORY, GPU_MEMORY) is None
    )
    assert gpu_room_refusal(250, 1000, 250, 1000, GPU_MEMORY) is None
    assert gpu_room_refusal(250, 1000, 249, 1000, GPU_MEMORY) is not None
    assert gpu_room_refusal(250, 1000, 250, 999, GPU_MEMORY) is not None
    assert gpu_kind_refusal((), "any", 250, "A100", "physical", GPU_MEMORY) is not None
    assert gpu_kind_refusal((), "any", 250, "A100", "vgpu", GPU_MEMORY) is None
    assert gpu_kind_refusal(("T4",), "any", MILLI_PER_GPU, "A100", "vgpu", GPU_MEMORY)
    assert gpu_kind_refusal((), "vgpu", MILLI_PER_GPU, "A100", "physical", GPU_MEMORY)
    assert gpu_kind_refusal((), "any", MILLI_PER_GPU, "A100", "physical", 100, 200)
    assert host_refusal(0, 0, None, None, [("zone", "a")], {"zone": "b"}, False, []) is not None
    assert host_refusal(0, 0, None, None, [], {}, True, []) is not None
    assert host_refusal(10**9, 10**9, None, None, [], {}, False, []) is None, "undeclared"
