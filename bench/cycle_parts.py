"""Where a placement cycle on a full cluster spends its time, part by part.

Builds the state of `placement_scale.py` (5,000 nodes x 8 GPUs, 50,000 openb jobs),
fills the cluster with bestfit cycles, then times, each `--repeat` times (the mean
printed), what a cycle with a blocked job reads from the state:

* reading one field of every running job (the floor of any pass over them);
* `node_views`: the views of every node;
* `holdings_of`: what every running job holds, and until when;
* `queue_order`: the queued jobs in order;
* one whole cycle (bestfit, with a kept index);
* the views and the holdings as the kept index gives them, the cycle before being the
  same (trees from e42443b on).

Runs against whichever tree is on PYTHONPATH (this one, or an earlier commit's:
`PYTHONPATH=$tree:$tree/libs python bench/cycle_parts.py`), to time a part before and
after a change in one run.

  python bench/cycle_parts.py [--nodes 5000] [--jobs 50000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from placement_scale import build

from gpuloom.placement import IndexCache, default_registry, node_views, placement_cycle
from gpuloom.queueing.order import queue_order
from gpuloom.runtime.collector import tune_collector
from gpuloom.state import ClusterState
from gpuloom.state.changes import ChangeFeed

try:  # where the cycle's inputs live (split out of cycle.py in 7450fe6)
    from gpuloom.placement.inputs import holdings_of
except ImportError:  # an earlier commit's tree
    from gpuloom.placement.cycle import holdings_of  # type: ignore[attr-defined,no-redef]


def timed(repeat: int, part: Callable[[], object]) -> float:
    """Mean milliseconds of `part` over `repeat` calls."""
    started = time.perf_counter()
    for _ in range(repeat):
        part()
    return 1000 * (time.perf_counter() - started) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    tune_collector()
    log = build(args.nodes, args.jobs, 42)
    changes = ChangeFeed()  # what the placement service's follower feeds its cache
    state = changes.fold(ClusterState(), log.records)
    policy = default_registry().get("bestfit")
    kept = IndexCache(changes)
    while decisions := placement_cycle(state, policy, kept=kept):
        for decision in decisions:
            changes.apply(state, log.append(decision.event))
    running = sorted({job for held in state.on_node.values() for job in held})
    print(f"{args.nodes} nodes full: {len(running)} jobs running, {len(state.queued)} queued")
    jobs = state.jobs
    parts: dict[str, Callable[[], object]] = {
        "one field of every running job": lambda: [jobs[j].last_seq for j in running],
        "node_views": lambda: node_views(state),
        "holdings_of": lambda: holdings_of(state),
        "queue_order": lambda: queue_order(state),
        "one whole cycle (bestfit)": lambda: placement_cycle(state, policy, kept=kept),
    }
    if hasattr(kept, "views_of"):  # trees from e42443b on: what the cycle keeps for the next
        parts["views kept from the cycle before"] = lambda: kept.views_of(state)
        parts["holdings kept from the cycle before"] = lambda: kept.holdings.of(state)
    for name, part in parts.items():
        print(f"  {name:32s} {timed(args.repeat, part):7.1f} ms", flush=True)


if __name__ == "__main__":
    main()
