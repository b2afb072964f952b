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
from dataclasses import dataclass


@dataclass
class DecayedUsage:
    """Usage (GPU-milli-seconds) decayed to `at` (seconds); `add` and `value_at` decay it."""

    half_life_s: float
    value: float = 0.0
    at: float = 0.0

    def _decay(self, to: float) -> float:
        if to <= self.at or self.value == 0.0:
            return self.value
        return self.value * math.pow(2.0, -(to - self.at) / self.half_life_s)

    def add(self, amount: float, at: float) -> None:
        """Charge `amount` at time `at` (not before the last charge's time)."""
        if at < self.at:
            raise ValueError(f"charge at {at} is before the last one at {self.at}")
        self.value = self._decay(at) + amount
        self.at = at

    def value_at(self, at: float) -> float:
        return self._decay(at)


def fair_share_factor(usage: float, total_usage: float, shares: int, total_shares: int) -> float:
    """2^(-(usage/total_usage) / (shares/total_shares)), in (0, 1]; 1 when nobody used any."""
    if shares <= 0 or total_shares <= 0:
        return 0.0
    if total_usage <= 0.0:
        return 1.0
    normalised_usage = usage / total_usage
    normalised_shares = shares / total_shares
    return round(math.pow(2.0, -normalised_usage / normalised_shares), 9)


def fair_share_factors(
    usage: Mapping[str, DecayedUsage], shares: Mapping[str, int], at: float
) -> dict[str, float]:
    """The factor of every account with shares, at time `at` (accounts in name order)."""
    decayed = {name: usage[name].value_at(at) if name in usage else 0.0 for name in sorted(shares)}
    total_usage = sum(decayed.values())
    total_shares = sum(max(0, s) for s in shares.values())
    return {
        name: fair_share_factor(decayed[name], total_usage, shares[name], total_shares)
        for name in sorted(shares)
    }
