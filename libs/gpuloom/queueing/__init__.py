"""Queueing policy, pure: decayed usage, fair share, multifactor priority.

Nothing here reads a clock: every time comes from the log (event `at`s), so the
queue's order is a function of the folded state and `gpuloom audit` can replay it.
"""

from gpuloom.queueing.fairshare import (
    fair_share_factor,
    fair_share_factors,
    normalised_shares,
)
from gpuloom.queueing.priority import PriorityFactors, PriorityWeights, multifactor_priority

__all__ = [
    "PriorityFactors",
    "PriorityWeights",
    "fair_share_factor",
    "fair_share_factors",
    "multifactor_priority",
    "normalised_shares",
]
