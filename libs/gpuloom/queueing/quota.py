"""Quotas with borrowing (as Kueue's cohorts), pure: may this account take `demand` more?

An account with a nominal quota may use it; beyond it, it may borrow what its
siblings (the accounts with the same parent) leave unused of their own nominal
quota, up to its borrowing limit; never beyond its cap. Accounts without a quota
are not limited. Amounts are milli-GPU (1000 per whole GPU).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Quota:
    parent: str | None
    nominal: int | None
    borrowing_limit: int | None = None
    cap: int | None = None


@dataclass
class QuotaTracker:
    """Usage per account during one placement cycle: `admits` asks, `take` records."""

    quotas: Mapping[str, Quota]
    used: dict[str, int] = field(default_factory=dict)

    def _idle_in_cohort(self, account: str) -> int:
        parent = self.quotas[account].parent
        idle = 0
        for name, quota in sorted(self.quotas.items()):
            if name == account or quota.parent != parent or quota.nominal is None:
                continue
            idle += max(0, quota.nominal - self.used.get(name, 0))
        return idle

    def why_not(self, account: str, demand: int) -> str | None:
        """None when `account` may take `demand` more now; else the reason (QuotaExceeded)."""
        quota = self.quotas.get(account)
        if quota is None or quota.nominal is None:
            return None
        after = self.used.get(account, 0) + demand
        if quota.cap is not None and after > quota.cap:
            return f"QuotaExceeded: {after} milli-GPU would pass the cap of {quota.cap}"
        if after <= quota.nominal:
            return None
        borrow = after - quota.nominal
        if quota.borrowing_limit is not None and borrow > quota.borrowing_limit:
            return (
                f"QuotaExceeded: would borrow {borrow} milli-GPU, "
                f"the limit is {quota.borrowing_limit}"
            )
        idle = self._idle_in_cohort(account)
        if borrow > idle:
            return (
                f"QuotaExceeded: {after} milli-GPU against a nominal {quota.nominal}, "
                f"and the cohort lends only {idle}"
            )
        return None

    def take(self, account: str, demand: int) -> None:
        self.used[account] = self.used.get(account, 0) + demand
