"""Advance reservations as a scheduling pass sees them: fences around GPUs
(docs/reservations.md).

For the whole pass every GPU of a reservation that has not ended is hidden from the
index (no free share, no free memory), so no policy, heap or search sees it. A job
then sees through the fences it may:

- a job that names reservation R (R started, the job let in) is placed on R's GPUs
  only: on a small index of R's nodes where R's GPUs show what they really have free
  and every other GPU shows nothing; what it takes is then taken on the pass's index;
- any other job may use the GPUs of a reservation that has not started when its time
  limit ends before the start, judged on the log's time of the pass (backfill before
  the window, as Slurm); a job without a time limit never does, and no job uses the
  GPUs of a reservation that has started (a `maint` one included) until it ends.

At the end of the pass every fence is lifted: the index shows what the GPUs have free,
with what the pass placed taken, as a kept index must.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from gpuloom.placement.engine import Context, NodeIndex, Policy
from gpuloom.placement.holdings import copy_view, hold
from gpuloom.placement.resources import GpuView, NodeView, Placement, Request
from gpuloom.placement.topology import place
from gpuloom.state import ClusterState

GpuKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Fence:
    """An advance reservation, its times in integer milliseconds of the log's clock."""

    name: str
    start: int
    end: int
    gpus: tuple[GpuKey, ...]
    users: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    maint: bool = False
    started: bool = False

    def lets_in(self, user: str, account: str) -> bool:
        return not self.maint and (user in self.users or account in self.accounts)

    def open_to(self, now: int, time_limit_s: int | None) -> bool:
        """A job not in it may use its GPUs: it ends (by its limit) before the start."""
        return (
            not self.started
            and time_limit_s is not None
            and now + 1000 * time_limit_s <= self.start
        )


def fences_of(state: ClusterState) -> tuple[Fence, ...]:
    """The state's reservations as fences, by name."""
    return tuple(
        Fence(
            name=r.name,
            start=_ms(r.start),
            end=_ms(r.end),
            gpus=r.gpus,
            users=r.users,
            accounts=r.accounts,
            maint=r.maint,
            started=r.started,
        )
        for r in sorted(state.reservations.values(), key=lambda r: r.name)
    )


def _ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


class Fences:
    """The fences of one pass over `index` (see the module doc). Build it, let each job
    place through `place_outside` or `place_inside`, and `lift` at the end."""

    def __init__(self, fences: Iterable[Fence], index: NodeIndex) -> None:
        self.index = index
        self.fences = {f.name: f for f in fences}
        #: What each hidden GPU really has free (milli, MiB), with what the pass took.
        self._true: dict[GpuKey, tuple[int, int]] = {}
        self.hidden: frozenset[GpuKey] = frozenset(
            key for f in self.fences.values() for key in f.gpus if _gpu(index, key) is not None
        )
        self._hide(sorted(self.hidden))

    # --- a job outside every reservation --------------------------------------------

    def open_keys(self, now: int, time_limit_s: int | None) -> tuple[str, ...]:
        """The reservations whose GPUs a job with this limit may use now, by name."""
        return tuple(
            name for name, fence in sorted(self.fences.items()) if fence.open_to(now, time_limit_s)
        )

    def seen_through(self, names: Sequence[str]) -> _Revealed:
        """Show the GPUs of reservations `names` as they are, while the `with` lasts."""
        keys = sorted({key for name in names for key in self.fences[name].gpus} & self.hidden)
        return _Revealed(self, keys)

    def blocking(self, request: Request, policy: Policy, context: Context) -> list[Fence]:
        """The reservations that keep a job from a place it would have without them: those
        whose GPUs it would take on their nodes as they really are (none: it fits on no
        reservation's nodes either). Asked of a job that fits nowhere, once per request
        in a pass; it looks at the reservations' nodes only, on copies."""
        views: list[NodeView] = []
        for node_name in sorted({node for node, _ in self.hidden}):
            view = copy_view(self.index.nodes[node_name])
            for gpu in view.gpus:
                free = self._true.get((node_name, gpu.index))
                if free is not None:
                    gpu.milli_free, gpu.memory_free_mib = free
            views.append(view)
        placement = place(request, NodeIndex(views), policy, context)
        if placement is None:
            return []
        used = {(p.node, p.index) for r in placement.replicas for p in r.slices}
        return [f for _, f in sorted(self.fences.items()) if used.intersection(f.gpus)]

    # --- a job of one reservation -------------------------------------------------------

    def place_inside(
        self, name: str, request: Request, policy: Policy, context: Context
    ) -> Placement | None:
        """Place a job of reservation `name` on its GPUs only, and take it on the index."""
        fence = self.fences[name]
        own = sorted(set(fence.gpus) & self.hidden)
        mine = set(own)
        views: list[NodeView] = []
        for node_name in sorted({node for node, _ in own}):
            view = copy_view(self.index.nodes[node_name])
            for gpu in view.gpus:
                free = self._true.get((node_name, gpu.index))
                gpu.milli_free, gpu.memory_free_mib = (
                    free if free is not None and (node_name, gpu.index) in mine else (0, 0)
                )
            views.append(view)
        placement = place(request, NodeIndex(views), policy, context)
        if placement is not None:
            with _Revealed(self, own):
                for replica in placement.replicas:
                    hold(self.index, replica)
        return placement

    # --- the end of the pass ------------------------------------------------------------

    def lift(self) -> None:
        """Show every GPU as it is again (what the pass took stays taken)."""
        self._reveal(sorted(self._true))

    def hide_on(self, index: NodeIndex, names: Iterable[str]) -> None:
        """Hide the fenced GPUs of nodes `names` on another index (a scratch copy that gave
        running jobs back): a GPU freed there is still not free for a job outside."""
        on = set(names)
        for key in sorted(k for k in self.hidden if k[0] in on):
            gpu = _gpu(index, key)
            if gpu is not None:
                gpu.milli_free = gpu.memory_free_mib = 0
        self._refile_on(index, sorted(name for name in on if name in index.nodes))

    @contextmanager
    def hidden_in(self, index: NodeIndex) -> Iterator[None]:
        """Hide the fenced GPUs on another index (the views with every running job given
        back, kept from cycle to cycle) while the `with` lasts, and restore them after."""
        saved: dict[GpuKey, tuple[int, int]] = {}
        for key in sorted(self.hidden):
            gpu = _gpu(index, key)
            if gpu is not None:
                saved[key] = (gpu.milli_free, gpu.memory_free_mib)
                gpu.milli_free = gpu.memory_free_mib = 0
        names = sorted({node for node, _ in saved})
        self._refile_on(index, names)
        try:
            yield
        finally:
            for key, (milli, memory) in saved.items():
                gpu = _gpu(index, key)
                assert gpu is not None
                gpu.milli_free, gpu.memory_free_mib = milli, memory
            self._refile_on(index, names)

    @staticmethod
    def _refile_on(index: NodeIndex, names: Sequence[str]) -> None:
        for name in names:
            node = index.nodes[name]
            node.forget()
            index.update(node)

    def _hide(self, keys: Sequence[GpuKey]) -> None:
        for key in keys:
            gpu = _gpu(self.index, key)
            assert gpu is not None
            self._true[key] = (gpu.milli_free, gpu.memory_free_mib)
            gpu.milli_free = gpu.memory_free_mib = 0
        self._refile(keys)

    def _reveal(self, keys: Sequence[GpuKey]) -> None:
        for key in keys:
            gpu = _gpu(self.index, key)
            assert gpu is not None
            milli, memory = self._true.pop(key)
            # what a job took while it was shown is taken from what it really has free
            gpu.milli_free, gpu.memory_free_mib = milli, memory
        self._refile(keys)

    def _refile(self, keys: Sequence[GpuKey]) -> None:
        self._refile_on(self.index, sorted({node for node, _ in keys}))


class _Revealed:
    """`with`: the GPUs `keys` show what they really have free; on leaving, what was taken
    of them meanwhile is kept, and they are hidden again."""

    def __init__(self, fences: Fences, keys: Sequence[GpuKey]) -> None:
        self.fences, self.keys = fences, keys

    def __enter__(self) -> None:
        self.fences._reveal(self.keys)

    def __exit__(self, *exc: object) -> None:
        self.fences._hide(self.keys)


def _gpu(index: NodeIndex, key: GpuKey) -> GpuView | None:
    node = index.nodes.get(key[0])
    if node is None:
        return None
    gpus = node.gpus
    number = key[1]
    if number < len(gpus) and gpus[number].index == number:  # GPUs by index, as registered
        return gpus[number]
    return next((g for g in gpus if g.index == number), None)
