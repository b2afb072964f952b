"""The GPU share a node's CPU is expected to strand (`stranding`), and loom v5 reading it."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from gpuloom.placement.engine import Context
from gpuloom.placement.fragmentation import Shape, Workload
from gpuloom.placement.policies import FGD, Loom
from gpuloom.placement.resources import NodeView, Request
from gpuloom.placement.stranding import CpuRate

from .cluster import gpus, hosts_of, node, place_on

#: 8 CPU milli per GPU milli: one whole GPU with 8000 CPU.
EIGHT = Workload(((Shape(8000, 1000, 1), 1),))


def test_cpu_rate_counts_gpu_shapes_per_gpu_and_leaves_cpu_only_shapes_out() -> None:
    workload = Workload(
        (
            (Shape(8000, 1000, 1), 3),
            (Shape(4000, 500, 1), 2),
            (Shape(16000, 1000, 2), 1),
            (Shape(32000, 0, 0), 5),
        )
    )
    rate = CpuRate.of(workload)
    assert (rate.cpu, rate.gpu) == (3 * 8000 + 2 * 4000 + 16000, 3000 + 1000 + 2000)
    assert rate.workload is workload
    assert rate.gpu_tasks_count


def test_stranded_is_the_gpu_the_free_cpu_cannot_carry_at_the_workloads_rate() -> None:
    rate = CpuRate.of(EIGHT)  # 8 CPU milli per GPU milli
    assert rate.stranded(16000, 2000) == 0  # exactly enough
    assert rate.stranded(64000, 2000) == 0  # more than enough: nothing, not a credit
    # 12000 CPU carries 1500 milli of GPU: 500 of the 2000 are stranded
    assert Fraction(rate.stranded(12000, 2000), rate.cpu) == 500
    assert Fraction(rate.stranded(0, 2000), rate.cpu) == 2000
    assert Fraction(rate.stranded(-3000, 2000), rate.cpu) == 2000  # overdrawn: all of it
    assert rate.stranded(0, 0) == 0


def test_a_workload_without_gpu_shapes_or_cpu_strands_nothing() -> None:
    assert CpuRate.of(Workload(((Shape(4000, 0, 0), 1),))).stranded(0, 8000) == 0
    assert CpuRate.of(Workload(((Shape(0, 1000, 1), 1),))).stranded(0, 8000) == 0
    # a GPU shape with no share of it: CPU and no GPU to carry, not "all stranded"
    assert CpuRate.of(Workload(((Shape(4000, 0, 1), 1),))).stranded(0, 8000) == 0
    no_cpu = Context(workload=Workload(((Shape(0, 1000, 1), 1),)))
    assert Loom().stranding_change(twins()[0], Request(gpus=0, cpu_milli=8000), no_cpu) == 0


@given(
    cpu=st.integers(-10_000, 200_000),
    gpu=st.integers(0, 8000),
    taken_cpu=st.integers(0, 50_000),
)
def test_stranding_never_shrinks_when_a_task_without_gpu_takes_cpu(
    cpu: int, gpu: int, taken_cpu: int
) -> None:
    rate = CpuRate.of(Workload(((Shape(8000, 1000, 1), 3), (Shape(3152, 470, 1), 2))))
    before, after = rate.stranded(cpu, gpu), rate.stranded(cpu - taken_cpu, gpu)
    assert 0 <= before <= after <= gpu * rate.cpu


def twins() -> list[NodeView]:
    """Two idle nodes of two GPUs, one with just the CPU its GPUs need (rank 0), one with
    four times that."""
    return [
        node("tight", 0, gpus(1000, 1000), cpu=16000),
        node("roomy", 1, gpus(1000, 1000), cpu=64000),
    ]


def test_loom_v5_sends_a_task_without_gpu_where_cpu_is_to_spare() -> None:
    """FGD's Δ is 0 on both (8000 CPU is still left on "tight" for the one shape), so
    FGD and loom v4 go by rank; on "tight" it would strand 1000 milli of GPU."""
    ctx = Context(workload=EIGHT)
    request = Request(gpus=0, cpu_milli=8000)
    tight, roomy = twins()
    assert (
        FGD().best_choice(tight, request, ctx)[0] == FGD().best_choice(roomy, request, ctx)[0] == 0
    )
    assert Loom().stranding_change(tight, request, ctx) == 1000
    assert Loom().stranding_change(roomy, request, ctx) == 0
    assert hosts_of(place_on(request, twins(), FGD(), ctx)) == ["tight"]
    assert hosts_of(place_on(request, twins(), Loom.version_4(), ctx)) == ["tight"]
    assert hosts_of(place_on(request, twins(), Loom(), ctx)) == ["roomy"]


def test_loom_v5_counts_the_gpu_the_task_takes_against_the_cpu_it_takes() -> None:
    """A GPU task asking the workload's CPU per GPU strands nothing; one asking 12000 for
    one GPU of "tight" leaves 4000 CPU for the other GPU, which carries 500 milli of it."""
    ctx = Context(workload=EIGHT)
    tight, roomy = twins()
    assert Loom().stranding_change(tight, Request(gpus=1, cpu_milli=8000), ctx) == 0
    assert Loom().stranding_change(tight, Request(gpus=1, cpu_milli=12000), ctx) == 500
    assert Loom().stranding_change(roomy, Request(gpus=1, cpu_milli=12000), ctx) == 0
    assert hosts_of(place_on(Request(gpus=1, cpu_milli=12000), twins(), Loom(), ctx)) == ["roomy"]
    # a share counts its milli: 500 milli with 12000 CPU on "tight" leaves 1500 milli of
    # GPU and 4000 CPU, which carries 500: 1000 stranded
    share = Request(gpus=1, gpu_milli=500, cpu_milli=12000)
    assert Loom().stranding_change(tight, share, ctx) == 1000


def test_loom_v5_weighs_stranding_and_leaves_nodes_without_cpu_out() -> None:
    ctx = Context(workload=EIGHT)
    request = Request(gpus=0, cpu_milli=8000)
    half = Loom()
    half.stranding_weight = Fraction(1, 2)
    assert half.stranding_change(twins()[0], request, ctx) == 500
    unmetered = node("unmetered", 0, gpus(1000, 1000))  # no CPU reported
    assert Loom().stranding_change(unmetered, request, ctx) == 0
    assert Loom.version_4().stranding_change(twins()[0], request, ctx) == 0
    assert Loom().score(unmetered, request, ctx) == Loom.version_4().score(unmetered, request, ctx)


def test_loom_v5_re_reads_the_rate_of_a_new_workload() -> None:
    loom = Loom()
    request = Request(gpus=0, cpu_milli=8000)
    assert loom.stranding_change(twins()[0], request, Context(workload=EIGHT)) == 1000
    four = Workload(((Shape(4000, 1000, 1), 1),))  # 4 per milli: 16000 carries 2000 + 2000
    assert loom.stranding_change(twins()[0], request, Context(workload=four)) == 0


def test_where_the_workload_names_models_only_tasks_without_a_gpu_count_stranding() -> None:
    """GPU tasks steered to CPU-rich nodes took the GPUs model-bound tasks needed."""
    bound = Workload(((Shape(8000, 1000, 1), 3), (Shape(8000, 1000, 1, frozenset({"B"})), 1)))
    ctx = Context(workload=bound)
    assert not CpuRate.of(bound).gpu_tasks_count
    tight = twins()[0]
    assert Loom().stranding_change(tight, Request(gpus=0, cpu_milli=8000), ctx) == 1000
    assert Loom().stranding_change(tight, Request(gpus=1, cpu_milli=12000), ctx) == 0
    assert Loom().stranding_change(tight, Request(gpus=1, cpu_milli=12000, models=("A",)), ctx) == 0
