"""How fast one user's jobs start on a node: a budget on a shared resource.

Starting a job costs the node (a shim, a cgroup, a private `/proc`, the spawn) and
every service after it (JobStarted, JobFinished, the charge, the view, the read
model): a user whose 10,000 tasks each end at once would otherwise have the whole
stack do nothing but start and end them, and everyone else's jobs wait behind that
work (docs/benchmarks.md, "Other users' latency"). So each node starts at most
`rate` jobs a second per user, with bursts of `burst`: a job over its user's budget
stays placed (its GPUs held, so placement gives it nothing more) and is started on a
later round, level triggered as everything the agent does. Other users' jobs are not
held by it: each user has a bucket of their own.

Time here is the agent's monotonic clock: this paces what the shell does, it decides
nothing the log records (the start is recorded when it happens).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StartBudget:
    """A token bucket per (node, user): `rate` starts a second, `burst` at once."""

    rate: float
    burst: float
    #: (node, user) -> (tokens, when they were counted).
    buckets: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def take(self, node: str, user: str, now: float) -> bool:
        """Whether `user` may start a job on `node` now (and count it if so)."""
        if not self.enabled:
            return True
        key = (node, user)
        tokens, then = self.buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate)
        if tokens < 1:
            self.buckets[key] = (tokens, now)
            return False
        self.buckets[key] = (tokens - 1, now)
        if len(self.buckets) > 4096:  # full buckets are the default: forget them
            self.buckets = {
                k: (t, at)
                for k, (t, at) in self.buckets.items()
                if min(self.burst, t + (now - at) * self.rate) < self.burst
            }
        return True
