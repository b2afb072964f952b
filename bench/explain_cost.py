"""What a pending job's reason costs the gateway: the placement pass explain runs.

Every pending reason of the API (`GET /v1/jobs/{id}`, the job list, `/explain`) is what
the placement pass says of the job (issue #37, `gpuloom.decide.explain`). The gateway
keeps the pass's inputs from one request to the next (`ReadModel.explainer`: the fast
twin's `IndexCache`) and stops the pass once the asked jobs are decided. This prints, on
a full cluster (4 nodes x 8 GPUs) with a queue of `--queued` one-GPU tasks of one user
and one job of another (fair queuing, backfill depth 500), the median time of a brief
explain of the job second in the queue, the fifth and the last: with the kept inputs,
and made afresh each time.

  python bench/explain_cost.py [--queued 10000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from gpuloom.decide.explain import Shared, explain
from gpuloom.events import QueuePolicySet
from gpuloom.placement import BestFit, IndexCache, placement_cycle
from gpuloom.state import ClusterState
from gpuloom.state.changes import ChangeFeed
from gpuloom.testing.builders import LogBuilder


def busy_state(queued: int, changes: ChangeFeed) -> ClusterState:
    log = LogBuilder()
    for number in range(4):
        log.register(f"n{number}", 8)
    log.append(QueuePolicySet(fair_queuing=True, backfill_depth=500))
    for index in range(32):
        log.run_to_queue(f"run{index}", gpus=1, user="mallory")
    log.record_decisions(placement_cycle(log.state(), BestFit()))
    for index in range(queued):
        log.run_to_queue(f"t{index}", gpus=1, user="mallory")
    log.run_to_queue("alice", gpus=1, user="alice")
    return changes.fold(ClusterState(), log.records)  # as the gateway's follower feeds it


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    changes = ChangeFeed()
    state = busy_state(args.queued, changes)
    policy, kept = BestFit(), IndexCache(changes)
    explain(state, "alice", shared=Shared(state, policy, kept, frozenset({"alice"})))  # warm
    print(f"{len(state.queued)} queued jobs, 32 GPUs full")
    for job in ("alice", "t3", f"t{args.queued - 1}"):
        fresh, warm = [], []
        for _ in range(args.rounds):
            started = time.perf_counter()
            found = explain(state, job, brief=True)
            fresh.append((time.perf_counter() - started) * 1000)
            shared = Shared(state, policy, kept, frozenset({job}))
            started = time.perf_counter()
            again = explain(state, job, brief=True, shared=shared)
            warm.append((time.perf_counter() - started) * 1000)
            assert found == again
        assert found is not None
        print(
            f"{job:>8} ({found.reason}): kept inputs {statistics.median(warm):.1f} ms,"
            f" afresh {statistics.median(fresh):.1f} ms (median of {args.rounds})"
        )


if __name__ == "__main__":
    main()
