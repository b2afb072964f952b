"""Actions a random log is played from (see test_fold_properties): plain values that
Hypothesis draws and shrinks; choices that depend on the state are integers taken
modulo what there is."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from hypothesis import strategies as st

from gpuloom.events import GpuSpec, NodeSpec, PolicyRef

NODES = ["n1", "n2", "n3"]
NOISE_KINDS = ["admit", "reject", "queue", "place", "place", "steal", "steal"]
NOISE_KINDS += ["start", "finish", "cancel", "charge"]
MODELS = ["A100", "H100"]
RANDOM_POLICY = PolicyRef(name="random", version=1)
INVENTORY_TIMEOUT = timedelta(seconds=30)


def node_spec(name: str, gpus: int, model: str) -> NodeSpec:
    """GPU uuids name the model: a re-registration with another model swaps the GPUs."""
    return NodeSpec(
        gpus=[
            GpuSpec(index=i, uuid=f"GPU-{name}-{i}-{model}", model=model, memory_mib=1024)
            for i in range(gpus)
        ]
    )


@dataclass(frozen=True)
class NodeChange:
    """Lose a ready node (often one with jobs) or recover a lost one (or, unless
    `sensible`, any node), or (re-)register a node."""

    kind: str
    pick: int
    sensible: bool
    gpus: int
    model: str


@dataclass(frozen=True)
class Submit:
    gpus: int
    models: tuple[str, ...]
    priority: int
    key: str | None
    reuse_id: bool
    pick: int
    #: Jobs of a higher priority may stop it (and it then yields to them).
    preemptible: bool = False


@dataclass(frozen=True)
class RequestCancel:
    pick: int


@dataclass(frozen=True)
class Schedule:
    """The first `services` of admission, queue and placement take a turn, each
    answering what the one before wrote."""

    services: int = 3


@dataclass(frozen=True)
class AgentTurn:
    """A node agent starts a placed job or finishes one of its jobs."""

    pick: int
    start: bool
    outcome: str
    seconds: int


@dataclass(frozen=True)
class Charge:
    seconds: int


@dataclass(frozen=True)
class InventoryTurn:
    """The inventory hears the nodes that are not `silent` (node `changed` with a new
    spec) and decides."""

    silent: tuple[bool, ...]
    changed: int
    gpus: int
    model: str


@dataclass(frozen=True)
class Noise:
    """An arbitrary event about some job, most often invalid where it lands."""

    kind: str
    pick: int
    shift: int
    node: str
    gpu_indexes: tuple[int, ...]
    corrupt_uuid: bool


picks = st.integers(0, 63)
#: Each kind of action with its strategy and its weight (how many out of the total).
WEIGHTED: list[tuple[int, st.SearchStrategy[object]]] = [
    (
        2,
        st.builds(
            NodeChange,
            st.sampled_from(["lose", "recover", "register"]),
            picks,
            st.integers(0, 3).map(bool),
            st.integers(0, 4),
            st.sampled_from(MODELS),
        ),
    ),
    (
        4,
        st.builds(
            Submit,
            st.integers(0, 5),
            st.lists(st.sampled_from([*MODELS, "B200"]), max_size=2, unique=True).map(tuple),
            st.integers(-2, 2),
            st.sampled_from([None, None, None, "k1", "k2"]),
            st.integers(0, 9).map(lambda n: n == 0),
            picks,
            st.integers(0, 2).map(lambda n: n == 0),
        ),
    ),
    (1, st.builds(RequestCancel, picks)),
    (3, st.builds(Schedule, st.integers(1, 3))),
    (
        3,
        st.builds(
            AgentTurn,
            picks,
            st.integers(0, 3).map(bool),
            st.sampled_from(["succeeded", "failed", "timed_out", "cancelled"]),
            st.integers(0, 3600),
        ),
    ),
    (1, st.builds(Charge, st.integers(0, 60))),
    (
        1,
        st.builds(
            InventoryTurn,
            st.lists(st.integers(0, 3).map(lambda n: n == 0), min_size=3, max_size=3).map(tuple),
            st.integers(0, 5),
            st.integers(0, 4),
            st.sampled_from(MODELS),
        ),
    ),
    (
        4,
        st.builds(
            Noise,
            st.sampled_from(NOISE_KINDS),
            picks,
            st.sampled_from([0, 0, 1, -1]),
            st.sampled_from([*NODES, "n9"]),
            st.lists(st.integers(0, 7), max_size=4).map(tuple),
            st.integers(0, 3).map(lambda n: n == 0),
        ),
    ),
]
ACTIONS: st.SearchStrategy[object] = st.sampled_from(
    [strategy for weight, strategy in WEIGHTED for _ in range(weight)]
).flatmap(lambda strategy: strategy)

#: A busier cluster with fewer ends: jobs of mixed priorities, a half of them
#: preemptible, queue while the nodes are full (preemption, requeued victims yielding).
PREEMPTING: st.SearchStrategy[object] = st.sampled_from(
    [
        *[st.builds(Submit, st.integers(1, 2), st.just(()), st.integers(-2, 2), st.none(),
                    st.just(False), picks, st.booleans())] * 4,
        *[st.builds(Schedule, st.just(3))] * 4,
        st.builds(AgentTurn, picks, st.integers(0, 3).map(bool),
                  st.sampled_from(["succeeded", "failed"]), st.integers(0, 600)),
        st.builds(RequestCancel, picks),
        st.builds(Charge, st.integers(0, 60)),
    ]
).flatmap(lambda strategy: strategy)  # fmt: skip
