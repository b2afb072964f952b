"""FGD's fragmentation measure (EVALUATION.md §4) with worked numbers, the typical workload
(top shapes to 95%) and the meter."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from gpuloom.placement.fragmentation import (
    FragmentationMeter,
    Shape,
    Workload,
    node_state,
)
from gpuloom.placement.resources import Request

from .cluster import gpu, gpus, node

# a node with 8000 CPU and four A vGPUs free 1000, 500, 200, 0: I_n = 1700
STATE = (("A", "vgpu", 1000), ("A", "vgpu", 500), ("A", "vgpu", 200), ("A", "vgpu", 0))
CPU = 8000


def shape_fragment(
    shape: Shape, cpu_free: int | None, gpus: tuple[tuple[str, str, int], ...]
) -> int:
    """The free milli-GPU `shape` could not use: the meter of a workload of that shape alone."""
    return FragmentationMeter(Workload(((shape, 1),))).of_state((cpu_free, gpus))


def test_case_1_cpu_only_shape_sees_every_free_gpu_as_fragment() -> None:
    assert shape_fragment(Shape(1000, 0, 0), CPU, STATE) == 1700
    assert shape_fragment(Shape(0, 0, 0), None, STATE) == 1700
    assert shape_fragment(Shape(0, 0, 0), CPU, ()) == 0


def test_case_2_model_mismatch_is_all_fragment() -> None:
    assert shape_fragment(Shape(1000, 500, 1, frozenset({"B"})), CPU, STATE) == 1700
    # a shape that allows the node's model is not a mismatch
    assert shape_fragment(Shape(1000, 500, 1, frozenset({"A", "B"})), CPU, STATE) == 200


def test_case_3_a_node_that_cannot_host_the_shape_is_all_fragment() -> None:
    # CPU shortage
    assert shape_fragment(Shape(8001, 100, 1), CPU, STATE) == 1700
    # fewer than k GPUs with free >= s: one idle GPU for two whole ones
    assert shape_fragment(Shape(0, 1000, 2), CPU, STATE) == 1700
    # two GPUs with >= 500 free but three needed
    assert shape_fragment(Shape(0, 500, 3), CPU, STATE) == 1700
    # a share above every free piece: the lone 500 is a fragment
    assert shape_fragment(Shape(0, 600, 1), CPU, (("A", "vgpu", 500),)) == 500


def test_case_4_only_pieces_too_small_for_the_shape_count() -> None:
    # s = 500: 200 + 0 are too small -> 200
    assert shape_fragment(Shape(1000, 500, 1), CPU, STATE) == 200
    # s = 600: 500 + 200 + 0 -> 700
    assert shape_fragment(Shape(1000, 600, 1), CPU, STATE) == 700
    # s = 300, k = 2: 1000 and 500 fit -> 200
    assert shape_fragment(Shape(0, 300, 2), CPU, STATE) == 200
    # whole GPU: everything but the idle GPU -> 700
    assert shape_fragment(Shape(0, 1000, 1), CPU, STATE) == 700
    # exactly the CPU left still hosts it; an undeclared CPU never constrains
    assert shape_fragment(Shape(8000, 500, 1), CPU, STATE) == 200
    assert shape_fragment(Shape(10**9, 500, 1), None, STATE) == 200


def test_mixed_pools_and_models_generalise_usability() -> None:
    state = (("A", "physical", 1000), ("A", "vgpu", 600), ("B", "vgpu", 1000))
    # a fraction cannot use the physical GPU: its 1000 is a fragment to it
    assert shape_fragment(Shape(0, 500, 1), None, state) == 1000
    # a whole GPU can use the physical and the idle vGPU: 600 is the fragment
    assert shape_fragment(Shape(0, 1000, 1), None, state) == 600
    # a B-only fraction: the A GPUs are fragments
    assert shape_fragment(Shape(0, 500, 1, frozenset({"B"})), None, state) == 1600
    # a B-only pair of fractions fits on only one GPU -> case 3
    assert shape_fragment(Shape(0, 500, 2, frozenset({"B"})), None, state) == 2600


def test_meter_is_the_weighted_sum_and_the_milli_average() -> None:
    workload = Workload(((Shape(0, 0, 0), 1), (Shape(1000, 500, 1), 2), (Shape(0, 1000, 2), 1)))
    meter = FragmentationMeter(workload)
    n = node("n", 0, gpus(1000, 500, 200, 0), cpu=CPU)
    assert node_state(n) == (CPU, tuple(sorted(STATE)))
    # 1·1700 + 2·200 + 1·1700
    assert meter.of_node(n) == 3800
    assert meter.of_node(n) == 3800  # memoised
    assert meter.milli(3800) == 950.0
    # the state ignores GPU order and memory
    shuffled = node(
        "m", 7, [gpu(3, free=0), gpu(0, free=200), gpu(2, free=1000, memory=5)], cpu=CPU
    )
    shuffled.gpus.append(gpu(9, free=500))
    assert meter.of_node(shuffled) == 3800
    assert FragmentationMeter(Workload(())).total == 1  # an empty workload divides by 1


def test_meter_cache_limit_clears_and_recomputes() -> None:
    meter = FragmentationMeter(Workload(((Shape(0, 0, 0), 1),)), cache_limit=2)
    states = [(None, (("A", "vgpu", free),)) for free in (100, 200, 300, 100)]
    assert [meter.of_state(s) for s in states] == [100, 200, 300, 100]


def test_shape_of_a_request() -> None:
    assert Shape.of(Request(gpus=2, cpu_milli=4000, models=("B", "A"))) == Shape(
        4000, 1000, 2, frozenset({"A", "B"})
    )
    assert Shape.of(Request(gpus=1, gpu_milli=250)) == Shape(0, 250, 1)
    assert Shape.of(Request(cpu_milli=100)) == Shape(100, 0, 0)  # CPU-only: no share


# --- the typical workload ----------------------------------------------------------------


def shapes_with_counts(counts: dict[Shape, int]) -> list[Shape]:
    tasks = [s for s, n in counts.items() for _ in range(n)]
    random.Random(1).shuffle(tasks)
    return tasks


A, B, C, D, E = (Shape(1000 * i, 1000, 1) for i in range(1, 6))


def test_typical_keeps_the_top_shapes_until_95_percent_are_covered() -> None:
    # 50 + 30 + 15 = 95 of 100: D and E are dropped
    workload = Workload.typical(shapes_with_counts({A: 50, B: 30, C: 15, D: 4, E: 1}))
    assert workload.shapes == ((A, 50), (B, 30), (C, 15))
    assert workload.total == 95
    # 50 + 30 + 14 = 94 < 95: D is needed too
    workload = Workload.typical(shapes_with_counts({A: 50, B: 30, C: 14, D: 5, E: 1}))
    assert workload.shapes == ((A, 50), (B, 30), (C, 14), (D, 5))
    # other coverages
    assert Workload.typical(shapes_with_counts({A: 50, B: 30, C: 20}), 50).shapes == ((A, 50),)
    assert len(Workload.typical(shapes_with_counts({A: 50, B: 30, C: 20}), 100).shapes) == 3
    assert Workload.typical([]).shapes == ()


def test_typical_orders_ties_by_fields_not_by_arrival() -> None:
    gpu_b = Shape(0, 1000, 1, frozenset({"B"}))
    gpu_a = Shape(0, 1000, 1, frozenset({"A"}))
    counts = {C: 10, A: 10, gpu_b: 10, gpu_a: 10, B: 1}
    first = Workload.typical(shapes_with_counts(counts))
    tasks = shapes_with_counts(counts)
    tasks.reverse()
    assert Workload.typical(tasks) == first
    assert [s for s, _ in first.shapes] == [gpu_a, gpu_b, A, C]  # (cpu, milli, k, models)


def plain_fragment(
    shape: Shape, cpu_free: int | None, gpus: tuple[tuple[str, str, int], ...]
) -> int:
    """EVALUATION.md §4 as written: the reference the meter's shortcuts must equal."""
    idle = sum(free for _, _, free in gpus)
    if shape.gpus == 0 or (cpu_free is not None and cpu_free < shape.cpu_milli):
        return idle

    def usable(model: str, pool: str) -> bool:
        return (not shape.models or model in shape.models) and (
            pool == "vgpu" or shape.gpu_milli >= 1000
        )

    room = [free >= shape.gpu_milli and usable(model, pool) for model, pool, free in gpus]
    if sum(room) < shape.gpus:
        return idle
    return sum(free for (_, _, free), fits in zip(gpus, room, strict=True) if not fits)


SHAPES = st.builds(
    Shape,
    st.sampled_from([0, 2000, 4000, 8000]),
    st.sampled_from([0, 250, 500, 1000]),
    st.integers(0, 3),
    st.sampled_from([frozenset(), frozenset({"A"}), frozenset({"B"}), frozenset({"A", "B"})]),
)
GPU_STATES = st.lists(
    st.tuples(st.sampled_from(["A", "B"]), st.sampled_from(["vgpu", "physical"]),
              st.sampled_from([0, 100, 250, 500, 750, 1000])),
    max_size=6,
).map(lambda gpus: tuple(sorted(gpus)))  # fmt: skip


@given(st.lists(st.tuples(SHAPES, st.integers(1, 5)), max_size=8), GPU_STATES,
       st.none() | st.sampled_from([0, 1000, 2000, 3000, 4000, 8000, 9000]))  # fmt: skip
def test_the_meter_is_the_weighted_sum_of_each_shapes_fragment(
    shapes: list[tuple[Shape, int]], gpus: tuple[tuple[str, str, int], ...], cpu: int | None
) -> None:
    """Shared tables per GPU state, one fragment per shape's GPU part, a binary search
    on CPU: the sum as written, for shapes that differ only in CPU too."""
    meter = FragmentationMeter(Workload(tuple(shapes)))
    expected = sum(weight * plain_fragment(shape, cpu, gpus) for shape, weight in shapes)
    assert meter.of_state((cpu, gpus)) == expected
    for shape, _ in shapes:
        assert shape_fragment(shape, cpu, gpus) == plain_fragment(shape, cpu, gpus)
