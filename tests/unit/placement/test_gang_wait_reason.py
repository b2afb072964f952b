"""Why a gang behind the blocked head waits (`SchedulingPass._why_not_placed`).

`Reservation` means "a node has room now, but it would run past the start of the job
that holds the reservation, on what that job reserved" (`placement.outcomes`). For a
gang the pass asks only whether one node could host one replica
(`NodeIndex.best_local`), so a gang that fits nowhere even with the reservation's slack
ignored is told `Reservation` instead of `Topology` (found on the replay of #38 item 3;
not fixed here: the test fails until it is)."""

from __future__ import annotations

from gpuloom.placement.candidate import Candidate
from gpuloom.placement.engine import Context, NodeIndex, place
from gpuloom.placement.holdings import Holding
from gpuloom.placement.outcomes import Reserved, Waiting
from gpuloom.placement.policies import BestFit
from gpuloom.placement.resources import NodeView, Request
from gpuloom.placement.scheduling import PassInputs, Rules, schedule

from .cluster import gpus

S = 1000
RACK_GANG = Request(gpus=2, replicas=2, topology=("rack", "required"))


def rack_cluster() -> NodeIndex:
    """Racks r0 (a0, a1) and r1 (b0, b1), two GPUs a node."""
    return NodeIndex(
        NodeView(name, rank, gpus(1000, 1000), topology={"nvlink": name, "rack": name[0]})
        for rank, name in enumerate(["a0", "a1", "b0", "b1"])
    )


def running(index: NodeIndex, job_id: str, on: str, ends_at: int) -> Holding:
    request = Request(gpus=1, within=("nvlink", on))
    placement = place(request, index, BestFit(), Context())
    assert placement is not None
    return Holding(job_id, placement.replicas, ends_at)


def test_a_rack_gang_that_fits_no_rack_even_unmasked_waits_for_topology() -> None:
    """One GPU busy in each rack: no rack has 4 free GPUs. The head gang reserves r0 for
    when `x` ends; the second gang fits no rack either, mask or not, so its reason is
    `Topology`, not `Reservation` (a1 and b1 could each host one of its replicas)."""
    index = rack_cluster()
    held = [running(index, "x", "a0", 100 * S), running(index, "y", "b0", 200 * S)]
    candidates = [Candidate("head", RACK_GANG, 600), Candidate("second", RACK_GANG, 600)]
    outcomes = schedule(PassInputs(candidates, index, Context(), 0, held), BestFit(), Rules())
    [reserved] = [o for o in outcomes if isinstance(o, Reserved)]
    assert reserved.reservation.job_id == "head"
    [second] = [o for o in outcomes if isinstance(o, Waiting) and o.job_id == "second"]
    assert second.code == "Topology", second.detail


def test_a_gang_that_fits_nowhere_even_unmasked_waits_for_resources() -> None:
    """The same without topology: x holds a GPU of a0 and y one of b0 until later. The
    head (3 x 2 GPUs) reserves what frees when x ends; the second gang (3 x 2 GPUs) has
    two nodes with room, not three, mask or not: `Resources`."""
    index = rack_cluster()
    held = [running(index, "x", "a0", 100 * S), running(index, "y", "b0", 200 * S)]
    gang = Request(gpus=2, replicas=3)
    candidates = [Candidate("head", gang, 600), Candidate("second", gang, 600)]
    outcomes = schedule(PassInputs(candidates, index, Context(), 0, held), BestFit(), Rules())
    [reserved] = [o for o in outcomes if isinstance(o, Reserved)]
    assert reserved.reservation.job_id == "head"
    [second] = [o for o in outcomes if isinstance(o, Waiting) and o.job_id == "second"]
    assert second.code == "Resources", second.detail
