"""Composition root of the queue service."""

from __future__ import annotations

import asyncio

from gpuloom.bus import EventBus
from gpuloom.config import Settings
from gpuloom.decide.queueing import decide_queue
from gpuloom.events import Decision, QueuePolicySet
from gpuloom.runtime.reactor import Reactor, pure
from gpuloom.runtime.service import run_service, snapshotter
from gpuloom.state import ClusterState


def configured_policy(settings: Settings) -> QueuePolicySet:
    return QueuePolicySet(
        weight_age=settings.priority_weight_age,
        weight_fair_share=settings.priority_weight_fair_share,
        weight_size=settings.priority_weight_size,
        max_age_s=settings.priority_max_age_s,
        fair_share_half_life_s=settings.fair_share_half_life_s,
        backfill=settings.backfill,
        backfill_depth=settings.backfill_depth or None,
        preemption=settings.preemption,
        victims_yield=True,  # not a choice: without it a victim can be preempted again and again
        fair_queuing=settings.queue_fair_queuing,
        unstarted_per_node=settings.queue_unstarted_per_node or None,
    )


async def main(settings: Settings, bus: EventBus, stop: asyncio.Event) -> None:
    policy = configured_policy(settings)

    def decide(state: ClusterState) -> list[Decision]:
        return decide_queue(state, policy)

    await Reactor(bus, "queue", pure(decide), snapshots=snapshotter(settings, bus, "queue")).run(
        stop
    )


def entrypoint(argv: list[str] | None = None) -> None:
    run_service("queue", main)


if __name__ == "__main__":
    entrypoint()
