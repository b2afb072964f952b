"""Quotas with borrowing (as Kueue's cohorts), pure: may this account take `demand` more?

An account with a nominal quota may use it; beyond it, it may borrow what its
siblings (the accounts with the same parent) leave unused of their own nominal
quota, up to its borrowing limit; never beyond its cap. Accounts without a quota
are not limited.

A quota is per resource kind (`RESOURCES`): all GPU time in milli-GPU
(`gpu_milli`, 1000 per whole GPU), whole GPUs (`gpus`, a count), or the
milli-GPU of one GPU model (`model:<name>`) or one pool (`pool:vgpu`,
`pool:physical`). A `QuotaTracker` follows one resource, a `QuotaBook` all of
them; a job's demand names the amount of each resource it takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuloom.events.accounts import GPU_MILLI, GPUS
from gpuloom.events.units import MILLI_PER_GPU

Demand = Mapping[str, int]


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
    resource: str = GPU_MILLI

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
        unit = self.unit
        if quota.cap is not None and after > quota.cap:
            return f"QuotaExceeded: {after} {unit} would pass the cap of {quota.cap}"
        if after <= quota.nominal:
            return None
        borrow = after - quota.nominal
        if quota.borrowing_limit is not None and borrow > quota.borrowing_limit:
            return (
                f"QuotaExceeded: would borrow {borrow} {unit}, the limit is {quota.borrowing_limit}"
            )
        idle = self._idle_in_cohort(account)
        if borrow > idle:
            return (
                f"QuotaExceeded: {after} {unit} against a nominal {quota.nominal}, "
                f"and the cohort lends only {idle}"
            )
        return None

    @property
    def unit(self) -> str:
        if self.resource == GPUS:
            return "GPUs"
        if self.resource == GPU_MILLI:
            return "milli-GPU"
        return f"milli-GPU of {self.resource}"

    def borrowing(self, account: str) -> bool:
        """Whether `account` uses more than its nominal quota (so it borrows)."""
        quota = self.quotas.get(account)
        return (
            quota is not None
            and quota.nominal is not None
            and self.used.get(account, 0) > quota.nominal
        )

    def take(self, account: str, demand: int) -> None:
        self.used[account] = self.used.get(account, 0) + demand


#: A user's or an account's limits are keyed ("user", name) and ("account", name).
Identity = tuple[str, str]


@dataclass
class QuotaBook:
    """Every resource's tracker: a demand passes if it passes each resource it names.

    It also holds the per-identity GPU maxima (LimitsSet `max_gpus`, as Slurm's
    GrpTRES=gres/gpu): `identity_caps` in milli-GPU by identity and what each holds
    (`identity_used`); a demand that names its `user` must fit under the user's
    maximum and its account's. A fraction counts as its share (milli-GPU).
    """

    trackers: dict[str, QuotaTracker] = field(default_factory=dict)
    identity_caps: dict[Identity, int] = field(default_factory=dict)
    identity_used: dict[Identity, int] = field(default_factory=dict)
    #: The most of one user's jobs placed and not started yet
    #: (`QueuePolicySet.unstarted_per_node` times the schedulable nodes); None: no limit.
    unstarted_cap: int | None = None
    #: Per user, their jobs placed and not started yet (those placed in this pass too).
    unstarted: dict[str, int] = field(default_factory=dict)
    #: The per-node figure behind `unstarted_cap`, for the reason it gives.
    unstarted_per_node: int | None = None

    def why_not(
        self, account: str, demand: Demand, user: str | None = None, *, pacing: bool = True
    ) -> str | None:
        for resource in sorted(demand):
            tracker = self.trackers.get(resource)
            if tracker is not None and demand[resource]:
                why = tracker.why_not(account, demand[resource])
                if why is not None:
                    return why
        if user is not None and self.identity_caps:
            why = self.identity_why_not(user, account, demand.get(GPU_MILLI, 0))
            if why is not None:
                return why
        if pacing and user is not None and self.unstarted_cap is not None:
            return self.pacing_why_not(user)
        return None

    def pacing_why_not(self, user: str) -> str | None:
        """None when `user` may have one more job placed and not started; else why (reason
        code StartPacing): the agents start each user's jobs at a paced rate, and jobs
        placed beyond that would hold GPUs idle that other users' jobs could run on."""
        cap, waiting = self.unstarted_cap, self.unstarted.get(user, 0)
        if cap is None or waiting < cap:
            return None
        return (
            f"StartPacing: {waiting} of user {user}'s jobs are placed and not started yet,"
            f" the most is {cap} ({self.unstarted_per_node} per node)"
        )

    def identity_why_not(self, user: str, account: str, milli: int) -> str | None:
        """None when `user` and `account` may hold `milli` more milli-GPU; else why
        (reason code AssocGrpGRES, as Slurm's), the user's maximum checked first."""
        if not milli:
            return None
        for identity in (("user", user), ("account", account)):
            cap = self.identity_caps.get(identity)
            if cap is None:
                continue
            used = self.identity_used.get(identity, 0)
            if used + milli > cap:
                return (
                    f"AssocGrpGRES: {identity[0]} {identity[1]} holds {_gpus(used)} GPUs and "
                    f"the job needs {_gpus(milli)}, the maximum is {_gpus(cap)} (max_gpus)"
                )
        return None

    def take(self, account: str, demand: Demand, user: str | None = None) -> None:
        """`account` (and `user`) take `demand`: a job placed in this pass, so one more
        of the user's jobs is not started yet."""
        self.hold(account, demand, user)
        if user is not None and self.unstarted_cap is not None:
            self.unstarted[user] = self.unstarted.get(user, 0) + 1

    def hold(self, account: str, demand: Demand, user: str | None = None) -> None:
        """What a job on a node holds, counted against the quotas and maxima."""
        for resource, amount in sorted(demand.items()):
            tracker = self.trackers.get(resource)
            if tracker is not None:
                tracker.take(account, amount)
        if user is not None and self.identity_caps:
            for identity in (("user", user), ("account", account)):
                if identity in self.identity_caps:
                    used = self.identity_used.get(identity, 0)
                    self.identity_used[identity] = used + demand.get(GPU_MILLI, 0)

    def limited(self, resource: str) -> bool:
        return resource in self.trackers


def _gpus(milli: int) -> str:
    """Milli-GPU as GPUs: `2`, `1.5`."""
    whole, rest = divmod(milli, MILLI_PER_GPU)
    return str(whole) if not rest else f"{whole}.{rest:03d}".rstrip("0")
