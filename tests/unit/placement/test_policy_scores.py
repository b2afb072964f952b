"""Each policy's scores stay in the range it states (`SCORES`), and only the policies
that say they need the typical workload read it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuloom.placement.engine import Context
from gpuloom.placement.policies import shipped_policies
from gpuloom.placement.resources import NodeView, Request, fits_locally

from .test_placement_properties import clusters, requests, workload_of


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), requests(), st.integers(0, 2**32))
def test_every_policy_scores_within_its_stated_range(
    nodes: list[NodeView], request: Request, seed: int
) -> None:
    local = replace(request, replicas=1, locality="local-only")
    feasible = [n for n in nodes if fits_locally(local, n)]
    context = Context(seed, 0, workload_of([local]))
    for policy in shipped_policies():
        if not feasible:
            continue
        scores = policy.normalize([policy.score(n, local, context) for n in feasible])
        low, high = policy.SCORES  # type: ignore[attr-defined]
        assert all(low <= s <= high for s in scores), (policy.name, scores)


@pytest.mark.parametrize("policy", shipped_policies(), ids=lambda p: p.name)
def test_a_policy_that_does_not_say_it_needs_the_workload_never_reads_it(policy: object) -> None:
    node = NodeView("n1", 0, [], 8000, None)
    request = Request(gpus=0, cpu_milli=1000)
    context = Context(1, 0, None)
    if policy.needs_workload:
        with pytest.raises(ValueError, match="needs a typical workload"):
            policy.score(node, request, context)  # type: ignore[attr-defined]
    else:
        assert isinstance(policy.score(node, request, context), int)  # type: ignore[attr-defined]
