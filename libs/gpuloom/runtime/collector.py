"""Python's cycle collector, tuned for processes that hold a large, long-lived state.

Every gpuloom process folds the log into a state of many small objects (jobs,
GPUs, holders, recent specs). With CPython's default thresholds (700, 10, 10) a
collection runs every 700 net allocations, and each tenth of the tenth one
walks every tracked object: at 50,000 jobs the placement cycle spent about a
third of its time in the collector (bench/placement_scale.py, docs/benchmarks.md).
A collection every 50,000 allocations, and older generations visited less
often, still frees garbage cycles within milliseconds and costs little memory;
reference counting, which frees everything else, is not affected.

The audit pauses the collector while it re-makes decisions
(`gpuloom.audit.workers.collector_paused`).
"""

from __future__ import annotations

import gc

#: Allocations between young collections; then how many young (middle) collections
#: between middle (full) ones.
THRESHOLDS = (50_000, 20, 50)


def tune_collector() -> None:
    """Apply `THRESHOLDS` (services, the gateway, the CLI and benchmarks call this first)."""
    gc.set_threshold(*THRESHOLDS)
