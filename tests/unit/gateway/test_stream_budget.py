"""The event streams' budget: streams per user and in all, replays at once and per minute,
each refusal a 429 with Retry-After; tickets given back once."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from services.gateway.stream_budget import OverBudget, StreamBudget


def budget(**limits: int) -> StreamBudget:
    settings = {
        "per_user": 3,
        "total": 5,
        "replays_per_user": 2,
        "replays_total": 3,
        "replays_per_minute": 4,
        "replay_behind": 100,
        **limits,
    }
    return StreamBudget(**settings)


def refused(action, match: str) -> OverBudget:  # type: ignore[no-untyped-def]
    with pytest.raises(OverBudget, match=match) as caught:
        action()
    assert caught.value.status_code == 429
    return caught.value


def refusals(reason: str) -> float:
    value = REGISTRY.get_sample_value("gpuloom_event_streams_refused_total", {"reason": reason})
    return value or 0.0


def test_one_user_holds_at_most_per_user_streams_and_others_still_get_theirs() -> None:
    shared = budget()
    before = refusals("per_user")
    tickets = [shared.take("mallory", False, 0.0) for _ in range(3)]
    error = refused(lambda: shared.take("mallory", False, 0.0), "mallory has 3 event streams")
    assert error.headers == {"Retry-After": "5"}
    assert refusals("per_user") == before + 1  # operators see it in /metrics
    assert REGISTRY.get_sample_value("gpuloom_event_streams", {"kind": "all"}) == 3
    shared.take("alice", False, 0.0)
    tickets[0].close()
    tickets[0].close()  # twice is once
    shared.take("mallory", False, 0.0)
    assert shared.streams["mallory"] == 3


def test_everyone_together_holds_at_most_total() -> None:
    shared = budget()
    for user in ("a", "b", "c", "d", "e"):
        shared.take(user, False, 0.0)
    refused(lambda: shared.take("f", False, 0.0), "serves 5 event streams")


def test_replays_at_once_per_user_and_in_all_end_when_they_catch_up() -> None:
    shared = budget()
    first = shared.take("mallory", True, 0.0)
    shared.take("mallory", True, 0.0)
    refused(lambda: shared.take("mallory", True, 0.0), "mallory has 2 event streams replaying")
    shared.take("mallory", False, 0.0)  # a stream at the log's end is no replay
    shared.take("alice", True, 0.0)
    refused(lambda: shared.take("bob", True, 0.0), "3 event streams replay the log now")
    first.caught_up()
    assert shared.replays["mallory"] == 1 and shared.streams["mallory"] == 3
    shared.take("bob", True, 0.0)


def test_replays_a_minute_are_a_bucket_that_refills() -> None:
    shared = budget(replays_per_user=10, replays_total=10)
    for _ in range(4):
        shared.take("mallory", True, 0.0).close()
    error = refused(lambda: shared.take("mallory", True, 1.0), "started 4 replays")
    assert error.headers == {"Retry-After": "14"}  # a token every 15 s, 1 s gone
    shared.take("mallory", True, 16.0)
    shared.take("alice", True, 1.0)  # another user's bucket is full


def test_a_stream_far_behind_the_end_is_a_replay_unless_it_follows_one_job() -> None:
    shared = budget()
    assert shared.is_replay(0, 5000, one_job=False)
    assert not shared.is_replay(4950, 5000, one_job=False)
    assert not shared.is_replay(0, 5000, one_job=True)
