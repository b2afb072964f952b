"""The rules that keep one replica of a job off a node, each with the reason it gives.

As kube-scheduler's Filter plugins: one list, in the order a person asks the
questions (does the node match, does it have such GPUs at all, enough of them, room
for the host's share), each filter answering with a reason or None. The rules
themselves are `gpu_serves` and `host_fits` (`gpuloom.placement.resources`), which
the engine's `fits_locally` uses on its hot path; a filter only names which of them
refuses and why, so the engine and what is shown to people cannot disagree
(tests/unit/placement/test_filters.py checks `fits_locally` against `refusal`, and
explain's verdict of every node against what placement does).

- `refusal(request, node)`: the first reason, None when the node fits now.
- `verdict(request, node, idle, ...)`: what `GET /v1/jobs/{id}/explain` shows for a
  node: lost, cordoned, a reason the node would give even idle (it never fits: its
  labels, its container runtimes, its GPU models, its pools, its size), or what is in use now ("busy").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuloom.placement.resources import NodeView, Request, gpu_serves, host_fits
from gpuloom.state.feasibility import runtime_refusal

FITS = "fits"


def _labels(request: Request, node: NodeView) -> str | None:
    if any(node.labels.get(k) != v for k, v in request.node_selector):
        return "labels: the node does not match the node selector"
    return None


def _runtime(request: Request, node: NodeView) -> str | None:
    if request.container and not node.runtimes:
        return "runtime: the node has no container runtime to run the job's image"
    refused = runtime_refusal(request.kubernetes, node.runtimes)
    return f"runtime: the node {refused}" if refused is not None else None


def _model(request: Request, node: NodeView) -> str | None:
    if request.gpus and request.models and not any(g.model in request.models for g in node.gpus):
        return f"model: no {' or '.join(request.models)} GPU"
    return None


def _pool(request: Request, node: NodeView) -> str | None:
    if request.gpus and not any(gpu_serves(request, g) for g in node.gpus):
        pool = "vgpu" if request.fractional else request.pool
        return f"pool: no GPU of the {pool} pool can serve it"
    return None


def _gpu_count(request: Request, node: NodeView) -> str | None:
    if request.gpus and sum(1 for g in node.gpus if gpu_serves(request, g)) < request.gpus:
        where = " (local-only)" if request.locality == "local-only" else ""
        return f"capacity: fewer than {request.gpus} such GPUs on the node{where}"
    return None


def _host(request: Request, node: NodeView) -> str | None:
    if not host_fits(request, node):
        return "capacity: not enough CPU or memory on the node, even idle"
    return None


@dataclass(frozen=True, slots=True)
class NodeFilter:
    name: str
    check: Callable[[Request, NodeView], str | None]
    #: The reason when only what is in use now makes it refuse (the node, idle, would
    #: pass); None: what is in use never changes this filter's answer.
    busy: str | None = None


FILTERS: tuple[NodeFilter, ...] = (
    NodeFilter("labels", _labels),
    NodeFilter("runtime", _runtime),
    NodeFilter("model", _model),
    NodeFilter("pool", _pool),
    NodeFilter("gpus", _gpu_count, busy="busy: its GPUs are in use"),
    NodeFilter("host", _host, busy="busy: its CPU or memory is in use"),
)


def refusal(request: Request, node: NodeView) -> str | None:
    """The first filter's reason that keeps one replica of `request` off `node` as it
    is now (all its GPU slices on the node); None: it fits (`fits_locally`)."""
    for node_filter in FILTERS:
        reason = node_filter.check(request, node)
        if reason is not None:
            return reason
    return None


def verdict(
    request: Request,
    node: NodeView,
    idle: NodeView,
    *,
    ready: bool = True,
    cordoned: str | None = None,
    out_of_service: str | None = None,
) -> str:
    """Why one replica of `request` cannot go on `node` now, or "fits".

    `idle`: the same node with nothing allocated; `cordoned`: the reason an admin
    cordoned the node, if they did (placement leaves out lost and cordoned nodes);
    `out_of_service`: its GPUs that failed a health check (`GpuUnhealthy`), said with
    "busy" (a failed GPU gives nothing until it is resumed).
    """
    if not ready:
        return "lost: the node does not heartbeat"
    if cordoned is not None:
        return f"cordoned: {cordoned or 'taken out of placement by an admin'}"
    never = refusal(request, idle)
    if never is not None:
        return never
    for node_filter in FILTERS:
        if node_filter.busy is not None and node_filter.check(request, node) is not None:
            if node_filter.name == "gpus" and out_of_service:
                return f"{node_filter.busy} or out of service ({out_of_service})"
            return node_filter.busy
    return FITS
