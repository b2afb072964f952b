"""What the streams of `GET /v1/events` may cost: how many one user and everyone hold,
and how many of them replay the log (issue #36: 1,500 streams of one user slowed a
burst for everyone 12-fold; 20-60 replays from `after=0` slowed others' reads 75-fold).

Every stream takes a `Ticket` before its answer starts; over a budget the request is
answered 429 with `Retry-After`, so an attacker's extra streams cost a refusal, not
everyone's latency:

* streams open: at most `per_user` of one user, `total` of everyone;
* replays (a stream that starts more than `replay_behind` events behind the log's end
  reads with a follower of its own, a JetStream consumer, until it reaches the shared
  hub): at most `replays_per_user` and `replays_total` at once, and each user starts
  at most `replays_per_minute` (a token bucket that holds as many).

A stream of one job (`?job=`) reads that job's subject index, which costs little: it
counts as a stream, never as a replay. The clock is a parameter (tests pass theirs).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from fastapi import HTTPException
from prometheus_client import Counter as MetricCounter
from prometheus_client import Gauge

#: How long a refused stream is told to wait when a count (not the rate) refused it.
RETRY_COUNT_S = 5
#: Buckets kept past this many users are dropped when full (a full bucket is a default).
BUCKETS_KEPT = 10_000

STREAMS = Gauge(
    "gpuloom_event_streams", "Event streams open (all), and those replaying the log", ["kind"]
)
REFUSED = MetricCounter(
    "gpuloom_event_streams_refused_total",
    "Event streams refused (429) for a budget: per_user, total, replays_per_user, "
    "replays_total, replay_rate",
    ["reason"],
)


class OverBudget(HTTPException):
    """429 with the reason and `Retry-After` (counted by `reason`)."""

    def __init__(self, reason: str, detail: str, retry_after_s: float) -> None:
        REFUSED.labels(reason).inc()
        seconds = max(1, math.ceil(retry_after_s))
        super().__init__(status_code=429, detail=detail, headers={"Retry-After": str(seconds)})


@dataclass
class StreamBudget:
    per_user: int = 16
    total: int = 256
    replays_per_user: int = 2
    replays_total: int = 8
    replays_per_minute: int = 10
    replay_behind: int = 1000
    streams: Counter[str] = field(default_factory=Counter)
    replays: Counter[str] = field(default_factory=Counter)
    #: user -> (tokens, when counted), for users whose bucket is not full.
    buckets: dict[str, tuple[float, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Read at scrape time (the gateway's one budget)."""
        STREAMS.labels("all").set_function(lambda: sum(self.streams.values()))
        STREAMS.labels("replaying").set_function(lambda: sum(self.replays.values()))

    def is_replay(self, start: int, log_end: int, one_job: bool) -> bool:
        """Whether a stream from `start` on a log that ends at `log_end` replays it."""
        return not one_job and log_end - start > self.replay_behind

    def take(self, user: str, replay: bool, now: float) -> Ticket:
        """A ticket for one more stream of `user` (a replay when `replay`), or OverBudget."""
        self.check_room(user)
        if replay:
            self._take_replay(user, now)
        self.streams[user] += 1
        return Ticket(self, user, replay)

    def check_room(self, user: str) -> None:
        """OverBudget if `user`, or everyone, holds every stream allowed: asked before
        the request costs anything more (a read of the log's end)."""
        if self.streams[user] >= self.per_user:
            raise OverBudget(
                "per_user",
                f"user {user} has {self.per_user} event streams open, the most one user may "
                "(GPULOOM_STREAMS_PER_USER); close one",
                RETRY_COUNT_S,
            )
        if sum(self.streams.values()) >= self.total:
            raise OverBudget(
                "total",
                f"the gateway serves {self.total} event streams, its most (GPULOOM_STREAMS_TOTAL)",
                RETRY_COUNT_S,
            )

    def _take_replay(self, user: str, now: float) -> None:
        if self.replays[user] >= self.replays_per_user:
            raise OverBudget(
                "replays_per_user",
                f"user {user} has {self.replays_per_user} event streams replaying the log, "
                "the most one user may at once (GPULOOM_STREAM_REPLAYS_PER_USER)",
                RETRY_COUNT_S,
            )
        if sum(self.replays.values()) >= self.replays_total:
            raise OverBudget(
                "replays_total",
                f"{self.replays_total} event streams replay the log now, the gateway's most "
                "(GPULOOM_STREAM_REPLAYS_TOTAL)",
                RETRY_COUNT_S,
            )
        tokens = self._tokens(user, now)
        if tokens < 1:
            rate = self.replays_per_minute / 60
            raise OverBudget(
                "replay_rate",
                f"user {user} started {self.replays_per_minute} replays of the log in the "
                "last minute, the most (GPULOOM_STREAM_REPLAYS_PER_MINUTE)",
                (1 - tokens) / rate,
            )
        self.buckets[user] = (tokens - 1, now)
        self.replays[user] += 1
        if len(self.buckets) > BUCKETS_KEPT:
            self._drop_full(now)

    def _tokens(self, user: str, now: float) -> float:
        most = float(self.replays_per_minute)
        tokens, at = self.buckets.get(user, (most, now))
        return min(most, tokens + max(0.0, now - at) * most / 60)

    def _drop_full(self, now: float) -> None:
        full = [user for user in self.buckets if self._tokens(user, now) >= self.replays_per_minute]
        for user in full:
            del self.buckets[user]

    def give_back(self, user: str, counter: Counter[str]) -> None:
        counter[user] -= 1
        if counter[user] <= 0:
            del counter[user]


@dataclass
class Ticket:
    """One stream's place in the budget: `caught_up` when its replay reached the hub,
    `close` when it ends (each idempotent)."""

    budget: StreamBudget
    user: str
    replaying: bool
    open: bool = True

    def caught_up(self) -> None:
        if self.replaying:
            self.replaying = False
            self.budget.give_back(self.user, self.budget.replays)

    def close(self) -> None:
        self.caught_up()
        if self.open:
            self.open = False
            self.budget.give_back(self.user, self.budget.streams)
