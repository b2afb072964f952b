"""Fair share, as Slurm's classic multifactor plugin computes it.

Each account's usage decays with a half-life, so last month weighs less than
today: after one half-life a charge counts half. The fair-share factor of an
account is 2^(-U/S), U its share of the (decayed) usage of all accounts and S
its share of the shares: 1 for an account that used nothing, 0.5 for one that
used exactly its share, towards 0 for one far over it.

Times are seconds from the log (`at` of the charging events); the decay is
applied lazily, so folding charges in order gives the same value whatever the
batching. Floating point is used for the decay (2^x), then rounded to 1e-9
before it enters an integer priority.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from gpuloom.state.usage import DecayedUsage


def fair_share_factor(usage: float, total_usage: float, shares: int, total_shares: int) -> float:
    """2^(-(usage/total_usage) / (shares/total_shares)), in (0, 1]; 1 when nobody used any."""
    if shares <= 0 or total_shares <= 0:
        return 0.0
    return _factor(usage, total_usage, shares / total_shares)


def _factor(usage: float, total_usage: float, normalised_shares: float) -> float:
    if normalised_shares <= 0.0:
        return 0.0
    if total_usage <= 0.0:
        return 1.0
    return round(math.pow(2.0, -(usage / total_usage) / normalised_shares), 9)


def normalised_shares(
    shares: Mapping[str, int], parents: Mapping[str, str | None] | None = None
) -> dict[str, float]:
    """Each account's share of the whole cluster, down the account tree (Slurm's classic).

    An account's part is its shares over the shares of its siblings (the accounts
    in `shares` with the same parent), times its parent's part: a team with 1 of
    its organisation's 2 shares, in an organisation with 1 of the cluster's 4,
    has 1/8. An account whose parent is not in `shares` counts as a top level one.
    """
    parents = parents or {}
    parent_of = {n: parents.get(n) if parents.get(n) in shares else None for n in sorted(shares)}
    siblings: dict[str | None, int] = {}
    for name in sorted(shares):
        siblings[parent_of[name]] = siblings.get(parent_of[name], 0) + max(0, shares[name])
    parts: dict[str, float] = {}

    def part(name: str, depth: int = 0) -> float:
        if name not in parts:
            total = siblings[parent_of[name]]
            own = max(0, shares[name]) / total if total else 0.0
            parent = parent_of[name]
            if parent is not None and depth < len(shares):  # depth: a cycle cannot loop
                own *= part(parent, depth + 1)
            parts[name] = own
        return parts[name]

    return {name: part(name) for name in sorted(shares)}


def fair_share_factors(
    usage: Mapping[str, DecayedUsage],
    shares: Mapping[str, int],
    at: float,
    parents: Mapping[str, str | None] | None = None,
) -> dict[str, float]:
    """The factor of every account with shares, at time `at` (accounts in name order).

    With `parents`, shares are normalised down the account tree
    (`normalised_shares`) and usage is each account's own against all accounts'.
    """
    decayed = {name: usage[name].value_at(at) if name in usage else 0.0 for name in sorted(shares)}
    total_usage = sum(decayed.values())
    part = normalised_shares(shares, parents)
    return {name: _factor(decayed[name], total_usage, part[name]) for name in sorted(shares)}
