"""Decayed usage, fair share and multifactor priority: the pure queueing functions."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuloom.queueing import (
    PriorityWeights,
    fair_share_factor,
    fair_share_factors,
    multifactor_priority,
    normalised_shares,
)
from gpuloom.state.usage import DecayedUsage

HOUR = 3600.0


@given(
    amount=st.floats(1.0, 1e12),
    start=st.floats(0.0, 1e8),
    half_life=st.floats(60.0, 1e7),
)
def test_decayed_usage_halves_after_one_half_life(
    amount: float, start: float, half_life: float
) -> None:
    usage = DecayedUsage(half_life)
    usage.add(amount, start)
    assert math.isclose(usage.value_at(start + half_life), amount / 2, rel_tol=1e-9)
    assert math.isclose(usage.value_at(start + 3 * half_life), amount / 8, rel_tol=1e-9)
    assert usage.value_at(start) == amount


@given(
    charges=st.lists(st.tuples(st.floats(0.0, 1e6), st.floats(0.0, 1e5)), min_size=1, max_size=20),
    split=st.integers(0, 20),
)
def test_folding_charges_in_any_batching_gives_the_same_usage(
    charges: list[tuple[float, float]], split: int
) -> None:
    ordered = sorted(charges, key=lambda c: c[1])
    direct = sum(a * 2 ** (-(ordered[-1][1] - t) / HOUR) for a, t in ordered)
    folded = DecayedUsage(HOUR)
    for amount, at in ordered:
        folded.add(amount, at)
    assert math.isclose(folded.value_at(ordered[-1][1]), direct, rel_tol=1e-9, abs_tol=1e-6)


def test_a_charge_back_in_time_is_refused() -> None:
    usage = DecayedUsage(HOUR)
    usage.add(10.0, 100.0)
    with pytest.raises(ValueError, match="before the last one"):
        usage.add(1.0, 50.0)


def test_fair_share_factor_is_one_unused_half_at_share_and_falls_beyond() -> None:
    assert fair_share_factor(0.0, 0.0, 1, 2) == 1.0
    assert fair_share_factor(0.0, 100.0, 1, 2) == 1.0
    assert fair_share_factor(50.0, 100.0, 1, 2) == 0.5  # used exactly its share
    assert fair_share_factor(100.0, 100.0, 1, 2) == 0.25  # twice its share
    assert fair_share_factor(10.0, 100.0, 0, 2) == 0.0  # no shares, no priority from them


@given(
    used=st.dictionaries(st.sampled_from("abcd"), st.floats(0.0, 1e9), min_size=1),
    shares=st.dictionaries(st.sampled_from("abcd"), st.integers(1, 100), min_size=1),
)
def test_more_usage_per_share_never_means_a_higher_factor(
    used: dict[str, float], shares: dict[str, int]
) -> None:
    usage = {}
    for name, amount in used.items():
        usage[name] = DecayedUsage(HOUR)
        usage[name].add(amount, 0.0)
    factors = fair_share_factors(usage, shares, at=0.0)
    assert list(factors) == sorted(shares)
    assert all(0.0 <= f <= 1.0 for f in factors.values())
    ratio = {n: used.get(n, 0.0) / shares[n] for n in shares}
    for a in shares:
        for b in shares:
            if ratio[a] < ratio[b]:
                assert factors[a] >= factors[b]


def test_multifactor_priority_weights_each_factor_in_points() -> None:
    weights = PriorityWeights(age=10, fair_share=50, size=5, max_age_s=100.0)
    low = multifactor_priority(
        weights,
        priority=3,
        waited_s=0,
        fair_share=0.5,
        gpu_milli_demand=1000,
        cluster_gpu_milli=8000,
    )
    assert (low.priority, low.age, low.fair_share, low.size) == (3, 0, 500_000, 125_000)
    assert low.total == 3 * 1_000_000 + 50 * 500_000 + 5 * 125_000
    older = multifactor_priority(
        weights,
        priority=3,
        waited_s=50,
        fair_share=0.5,
        gpu_milli_demand=1000,
        cluster_gpu_milli=8000,
    )
    assert older.total - low.total == 10 * 500_000  # half the max age: half of 10 points
    capped = multifactor_priority(
        weights,
        priority=3,
        waited_s=1e9,
        fair_share=0.5,
        gpu_milli_demand=1000,
        cluster_gpu_milli=8000,
    )
    assert capped.age == 1_000_000


def test_default_weights_are_plain_priority() -> None:
    weights = PriorityWeights()
    assert weights.plain
    a = multifactor_priority(
        weights, priority=1, waited_s=0, fair_share=0.0, gpu_milli_demand=0, cluster_gpu_milli=1
    )
    b = multifactor_priority(
        weights, priority=0, waited_s=1e9, fair_share=1.0, gpu_milli_demand=1, cluster_gpu_milli=1
    )
    assert a.total > b.total


@given(
    priority=st.integers(-1_000_000, 1_000_000),
    waited=st.floats(0.0, 1e7),
    share=st.floats(0.0, 1.0),
    demand=st.integers(0, 64_000),
)
def test_priority_is_monotone_in_every_factor(
    priority: int, waited: float, share: float, demand: int
) -> None:
    weights = PriorityWeights(age=100, fair_share=500, size=50)

    def total(**changes: float) -> int:
        args = {
            "priority": priority,
            "waited_s": waited,
            "fair_share": share,
            "gpu_milli_demand": demand,
        }
        args.update(changes)
        return multifactor_priority(weights, cluster_gpu_milli=64_000, **args).total  # type: ignore[arg-type]

    base = total()
    assert total(priority=priority + 1) > base
    assert total(waited_s=waited + 3600) >= base
    assert total(fair_share=min(1.0, share + 0.1)) >= base
    assert total(gpu_milli_demand=min(64_000, demand + 1000)) >= base


def test_shares_are_normalised_down_the_account_tree() -> None:
    shares = {"org-a": 1, "org-b": 3, "team-1": 1, "team-2": 1, "solo": 0}
    parents = {"team-1": "org-a", "team-2": "org-a", "solo": "org-b"}
    parts = normalised_shares(shares, parents)
    assert parts["org-a"] == 0.25 and parts["org-b"] == 0.75
    assert parts["team-1"] == parts["team-2"] == 0.125
    assert parts["solo"] == 0.0


def test_a_team_of_a_small_organisation_falls_faster_than_a_big_one() -> None:
    shares = {"org-a": 1, "org-b": 3, "a1": 1, "b1": 1}
    parents = {"a1": "org-a", "b1": "org-b"}
    usage = {name: DecayedUsage(HOUR) for name in ("a1", "b1")}
    usage["a1"].add(100.0, 0.0)
    usage["b1"].add(100.0, 0.0)
    factors = fair_share_factors(usage, shares, 0.0, parents)
    assert factors["a1"] == round(2 ** (-0.5 / 0.25), 9)  # half the usage on a quarter share
    assert factors["b1"] == round(2 ** (-0.5 / 0.75), 9)
    assert factors["b1"] > factors["a1"]


@given(
    shares=st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 50), min_size=1),
    links=st.dictionaries(st.sampled_from("abcdef"), st.sampled_from("abcdef")),
)
def test_normalised_shares_of_each_level_add_up_to_at_most_one(
    shares: dict[str, int], links: dict[str, str]
) -> None:
    # a tree: a parent comes earlier in the alphabet (no cycles, as the fold ensures)
    parents: dict[str, str | None] = {c: p for c, p in links.items() if p < c}
    parts = normalised_shares(shares, parents)
    assert all(0.0 <= part <= 1.0 for part in parts.values())
    tops = [n for n in shares if parents.get(n) not in shares]
    assert sum(parts[n] for n in tops) <= 1.0 + 1e-9
    for name in shares:
        children = [c for c in shares if parents.get(c) == name]
        assert sum(parts[c] for c in children) <= parts[name] + 1e-9
