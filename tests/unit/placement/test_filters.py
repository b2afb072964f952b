"""The placement filters give a reason exactly when the engine refuses a node, and
explain's verdict of every node is what placement does with it."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from hypothesis import HealthCheck, given, settings

from gpuloom.decide.explain import explain
from gpuloom.events import NodeCordoned
from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.placement.engine import Context, NodeIndex, place
from gpuloom.placement.filters import FITS, refusal, verdict
from gpuloom.placement.inputs import node_views, request_of
from gpuloom.placement.policies import BestFit
from gpuloom.placement.resources import NodeView, Request, fits_locally
from gpuloom.testing.builders import LogBuilder

from .cluster import copy_nodes
from .test_placement_properties import clusters, requests


def idle_of(node: NodeView) -> NodeView:
    """The node with its GPUs free (its host's CPU and memory as they are)."""
    gpus = [replace(g, milli_free=MILLI_PER_GPU, memory_free_mib=g.memory_mib) for g in node.gpus]
    return replace(node, gpus=gpus, cached_state=None, cached_gpus=None)


def placed_alone(request: Request, node: NodeView) -> bool:
    """Whether the engine places one local replica of `request` on `node` alone."""
    one = replace(request, replicas=1, locality="local-only")
    return place(one, NodeIndex(copy_nodes([node])), BestFit(), Context()) is not None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), requests())
def test_a_node_has_no_reason_exactly_when_the_engine_takes_it(
    nodes: list[NodeView], request: Request
) -> None:
    local = replace(request, replicas=1, locality="local-only")
    for node in nodes:
        fits = fits_locally(local, node)
        assert (refusal(local, node) is None) == fits, (node, local)
        assert (verdict(local, node, idle_of(node)) == FITS) == fits, (node, local)
        assert placed_alone(local, node) == fits, (node, local)


def varied_cluster() -> LogBuilder:
    """Nodes of two models, one lost, one cordoned, jobs running and queued."""
    log = LogBuilder()
    log.register("a1", 2)
    log.register("a2", 4)
    log.register("h1", 2, model="H100-80GB")
    log.register("gone", 8)
    log.lose("gone")
    log.register("closed", 8)
    log.append(NodeCordoned(node="closed", reason="maintenance"))
    log.run_to_queue("runner", gpus=2, time_limit_s=600)
    log.place("runner", "a2", [0, 1])
    log.start("runner", "a2")
    log.run_to_queue("one", gpus=1)
    log.run_to_queue("two", gpus=2)
    log.run_to_queue("three", gpus=3)
    log.run_to_queue("h100", gpus=1, gpu_model=["H100-80GB"])
    log.run_to_queue("many", gpus=8)
    log.run_to_queue("cpu-only", gpus=0, cpu_milli=1000)
    return log


def test_explain_says_fits_exactly_where_placement_would_place_the_job() -> None:
    state = varied_cluster().state()
    views = {v.name: v for v in node_views(state)}  # the nodes placement sees
    for job_id in sorted(state.queued):
        request = request_of(state.jobs[job_id].spec)
        found = explain(state, job_id)
        assert found is not None
        for name, said in found.nodes.items():
            placeable = name in views and placed_alone(request, views[name])
            assert (said == FITS) == placeable, (job_id, name, said)


def test_the_estimate_of_a_gang_waits_for_every_node_it_needs() -> None:
    """Two replicas of two GPUs need both nodes: the later end, as the scheduler's
    reservation search says (an estimate per node would say the earlier one)."""
    log = LogBuilder()
    log.register("n1", 2)
    log.register("n2", 2)
    log.run_to_queue("short", gpus=2, time_limit_s=600)
    log.place("short", "n1", [0, 1])
    log.start("short", "n1")
    log.run_to_queue("long", gpus=2, time_limit_s=1200)
    log.place("long", "n2", [0, 1])
    log.start("long", "n2")
    log.run_to_queue("gang", gpus=2, replicas=2)
    state = log.state()
    found = explain(state, "gang")
    assert found is not None and found.reason == "Resources"
    started = state.jobs["long"].started_at
    assert started is not None
    assert found.estimated_start == started + timedelta(seconds=1200)
