"""`gpuloom audit` in one process and shared among several, alternating, on one log.

The log is `placement_scale.py`'s: 5,000 nodes x 8 GPUs, 50,000 openb jobs, placed
cycle by cycle (up to 10,000 decisions each) until the cluster is full. Then, for
`--rounds` rounds, the audit runs with 1 worker and with each count of `--workers`,
in turn in this process, and prints each one's decisions per second (fold included)
and its ratio to the 1-worker audit of the same round. The machine's speed moves
from minute to minute; the ratio within a round is the figure.

  python bench/audit_workers.py [--policy fgd] [--workers 2] [--rounds 3] [--nodes 5000]
"""

from __future__ import annotations

import argparse
import statistics

from placement_scale import Log, build

from gpuloom.audit import audit
from gpuloom.audit.workers import usable_cpus
from gpuloom.placement.cycle import placement_cycle
from gpuloom.placement.incremental.index_cache import IndexCache
from gpuloom.placement.registry import default_registry
from gpuloom.runtime.collector import tune_collector
from gpuloom.state import ClusterState
from gpuloom.state.changes import ChangeFeed


def placed_log(nodes: int, jobs: int, policy_name: str) -> Log:
    """The submissions, then every cycle's decisions until nothing more fits."""
    log = build(nodes, jobs, 42)
    policy = default_registry().get(policy_name)
    changes = ChangeFeed()  # what the placement service's follower feeds its cache
    state = changes.fold(ClusterState(), log.records)
    kept = IndexCache(changes)
    while decisions := placement_cycle(state, policy, kept=kept):
        for decision in decisions:
            changes.apply(state, log.append(decision.event))
    return log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--policy", default="fgd")
    parser.add_argument("--workers", default="2", help="counts to time beside 1, e.g. 2,4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--jobs", type=int, default=50_000)
    args = parser.parse_args()
    tune_collector()  # as `gpuloom audit` does
    log = placed_log(args.nodes, args.jobs, args.policy)
    counts = [1, *(int(n) for n in args.workers.split(","))]
    print(
        f"{args.policy}: {len(log.records)} events; {usable_cpus()} usable CPUs; "
        f"audits of 1 and {args.workers} workers, alternating, {args.rounds} rounds"
    )
    ratios: dict[int, list[float]] = {n: [] for n in counts[1:]}
    for number in range(1, args.rounds + 1):
        alone = 0.0
        for workers in counts:
            report = audit(log.records, workers=workers)
            assert report.ok, report.mismatches[:3]
            rate = report.verified / report.seconds
            if workers == 1:
                alone = rate
                line = ""
            else:
                ratios[workers].append(rate / alone)
                line = f", {rate / alone:.2f}x the 1-process audit"
            print(
                f"round {number}, {report.workers} process(es): {report.verified} decisions "
                f"in {report.seconds:.2f} s ({rate:,.0f} decisions/s{line})",
                flush=True,
            )
    for workers, values in ratios.items():
        print(f"{workers} workers: mean {statistics.fmean(values):.2f}x the 1-process audit")


if __name__ == "__main__":
    main()
