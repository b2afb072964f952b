"""Decayed usage: what the fold keeps of each account's charges.

Each account's usage decays with a half-life, so last month weighs less than today:
after one half-life a charge counts half. The fold adds each charge at its event's
time; the fair-share policy (`gpuloom.queueing.fairshare`) reads the value at the
time it decides. The decay is applied lazily, so folding charges in order gives the
same value whatever the batching.
"""

from __future__ import annotations

import math
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
