"""What a GPU's free share is expected to end as (`gap_value`), and loom v4 reading it."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from gpuloom.placement.engine import Context
from gpuloom.placement.fragmentation import Shape, Workload
from gpuloom.placement.gap_value import GapValues, bound_models, gap_values
from gpuloom.placement.policies import FGD, Loom
from gpuloom.placement.resources import NodeView, Request

from .cluster import gpus, hosts_of, node, place_on

HALF = Shape(0, 500, 1)
WHOLE_GPU = Shape(0, 1000, 1)


def test_gap_values_worked_example() -> None:
    """Shares of 500 and whole GPUs, one each; c = 1/5.

    Below 500 nothing fits: W(f) = f. From 500 only the half fits (p = 1/2), so a gap
    stays unfilled with h = (1/5) / (1/5 + 1/2) = 2/7: W(f) = 2/7 f + 5/7 (f - 500).
    At 1000 both fit (p = 1): h = 1/6, W = 1000/6 + 5/6 * (W(500) + W(0)) / 2."""
    values = gap_values(Workload(((HALF, 1), (WHOLE_GPU, 1))))
    assert len(values) == 1001
    assert [values[f] for f in (0, 1, 120, 499)] == [0, 1, 120, 499]
    assert values[500] == round(500 - Fraction(2500, 7)) == 143
    assert values[700] == round(700 - Fraction(2500, 7)) == 343
    w500 = 500 - Fraction(2500, 7)
    assert values[1000] == round(Fraction(1000, 6) + Fraction(5, 6) * w500 / 2) == 226


def test_gap_values_weigh_shapes_per_gpu_and_leave_cpu_only_shapes_out() -> None:
    """A shape of two whole GPUs counts twice; a shape with no GPU does not count: the
    same values as one whole-GPU shape of twice the weight, beside the half."""
    two = Workload(((HALF, 2), (Shape(0, 1000, 2), 1), (Shape(4000, 0, 0), 50)))
    assert gap_values(two) == gap_values(Workload(((HALF, 2), (WHOLE_GPU, 2))))
    nothing = Workload(((HALF, 2), (WHOLE_GPU, 2), (Shape(0, 0, 1), 5)))  # not a share
    assert gap_values(nothing) == gap_values(Workload(((HALF, 2), (WHOLE_GPU, 2))))
    assert gap_values(two, Fraction(1)) != gap_values(two)


def test_bound_models_are_the_models_shapes_name() -> None:
    workload = Workload(
        (
            (HALF, 1),
            (Shape(0, 1000, 1, frozenset({"T4"})), 1),
            (Shape(0, 300, 1, frozenset({"P100", "T4"})), 1),
        )
    )
    assert bound_models(workload) == {"T4", "P100"}
    assert GapValues.of(workload).bound_models == {"T4", "P100"}


#: Shares of 470 are common, 320 rarer; whole GPUs fill the rest.
SHARES = Workload(((Shape(0, 470, 1), 3), (Shape(0, 320, 1), 1), (WHOLE_GPU, 4)))


def test_loom_v4_keeps_a_gap_the_next_common_share_would_close() -> None:
    """A 320 share, a GPU with 530 free or one with 680 free. FGD (and loom v3) take the
    530 gap: it removes more fragment now. But 530 is what the next 470 share nearly
    closes, while the 210 it leaves fits nothing but rare shares; after the 680 gap the
    360 left still takes a 320. Version 4 adds W(after) - W(before), times the
    workload's weight: 530 -> 210 is -11, 680 -> 360 is -112."""
    ctx = Context(workload=SHARES)
    request = Request(gpus=1, gpu_milli=320)

    def cluster() -> list[NodeView]:
        return [node("gap530", 0, gpus(530, 0)), node("gap680", 1, gpus(680, 0))]

    values = gap_values(SHARES)
    assert (values[210] - values[530], values[360] - values[680]) == (-11, -112)
    for older in (FGD(), Loom.version_3()):
        gap530, gap680 = cluster()
        assert older.best_choice(gap530, request, ctx)[0] == -440
        assert older.best_choice(gap680, request, ctx)[0] == -200
        assert hosts_of(place_on(request, cluster(), older, ctx)) == ["gap530"]
    gap530, gap680 = cluster()
    assert Loom().best_choice(gap530, request, ctx)[0] == -440 - 11 * 8
    assert Loom().best_choice(gap680, request, ctx)[0] == -200 - 112 * 8
    assert hosts_of(place_on(request, cluster(), Loom(), ctx)) == ["gap680"]


def test_loom_v4_chooses_the_gpu_inside_a_node_the_same_way() -> None:
    ctx = Context(workload=SHARES)
    request = Request(gpus=1, gpu_milli=320)
    both = node("both", 0, gpus(530, 680))
    assert [g.index for g in Loom.version_3().pick(both, request, ctx)] == [0]
    assert [g.index for g in Loom().pick(both, request, ctx)] == [1]


def test_loom_v4_leaves_the_gaps_of_a_bound_model_to_the_bound_tasks() -> None:
    """When a shape is bound to T4, a share free to run anywhere is scored on a T4 GPU
    as version 3 scores it; a share bound to T4 still reads the gaps' values."""
    bound = Shape(0, 320, 1, frozenset({"T4"}))
    workload = Workload((*SHARES.shapes, (bound, 1)))
    ctx = Context(workload=workload)
    free, for_t4 = Request(gpus=1, gpu_milli=320), Request(gpus=1, gpu_milli=320, models=("T4",))
    t4 = node("t4", 0, gpus(680, 0, model="T4"))
    a = node("a", 0, gpus(680, 0))
    assert Loom().best_choice(t4, free, ctx)[0] == Loom.version_3().best_choice(t4, free, ctx)[0]
    assert Loom().best_choice(a, free, ctx)[0] != Loom.version_3().best_choice(a, free, ctx)[0]
    assert (
        Loom().best_choice(t4, for_t4, ctx)[0] != Loom.version_3().best_choice(t4, for_t4, ctx)[0]
    )


def test_loom_v4_reads_the_gaps_of_shares_on_one_gpu_only() -> None:
    """Whole GPUs, CPU-only tasks and a share over two GPUs score as in version 3."""
    ctx = Context(workload=SHARES)
    cluster = node("n", 0, gpus(530, 680, 1000, 1000))
    for request in (Request(gpus=1), Request(gpus=2), Request(), Request(gpus=2, gpu_milli=320)):
        assert (
            Loom().best_choice(cluster, request, ctx)[0]
            == Loom.version_3().best_choice(cluster, request, ctx)[0]
        )


def test_loom_v4_reads_the_gaps_of_the_workload_in_its_context() -> None:
    """One policy, the workload read again (every 100 submissions): the new one's values."""
    policy, other = Loom(), Workload(((HALF, 1), (WHOLE_GPU, 1)))
    for workload in (other, SHARES, other):
        found = policy.gap_values(Context(workload=workload))
        assert found is not None and found.values == gap_values(workload)
    assert Loom.version_3().gap_values(Context(workload=SHARES)) is None


@given(
    shapes=st.lists(
        st.tuples(st.integers(1, 1000), st.integers(0, 3), st.integers(1, 9)),
        min_size=1,
        max_size=8,
    ),
    competition=st.fractions(min_value=Fraction(1, 100), max_value=10),
)
def test_a_gap_ends_as_no_more_than_itself_and_unfillable_ones_as_all_of_it(
    shapes: list[tuple[int, int, int]], competition: Fraction
) -> None:
    workload = Workload(tuple((Shape(0, milli, gpus), weight) for milli, gpus, weight in shapes))
    values = gap_values(workload, competition)
    smallest = min((milli for milli, gpus, _ in shapes if gpus), default=1001)
    assert values[0] == 0
    for free in range(1, 1001):
        assert 0 <= values[free] <= free
        if free < smallest:
            assert values[free] == free
