"""How long a snapshot of the folded state takes to encode and decode, and its size.

A state of 100 nodes x 8 GPUs and JOBS live jobs (800 running, the rest queued), after
2,000 more ended and were charged (forgotten but for their tombstones, unless the fold
keeps history). Prints one line per measure; run `python bench/snapshot_codec.py [JOBS]`.
Pure: no NATS needed.
"""

from __future__ import annotations

import lzma
import sys
import time
import zlib

from gpuloom.state import ClusterState, fold
from gpuloom.state.snapshot import decode_snapshot, encode_snapshot, serialize_state
from gpuloom.state.snapshot_schema import state_codec
from gpuloom.testing.builders import LogBuilder

NODES, GPUS = 100, 8


def build(jobs: int) -> ClusterState:
    log = LogBuilder()
    for n in range(NODES):
        log.register(f"node-{n:03d}", GPUS, "H100-80GB")
    env = {"WANDB_PROJECT": "llm", "NCCL_DEBUG": "WARN"}
    ended = 2000
    for j in range(jobs + ended):
        log.run_to_queue(
            f"job-{j:06d}",
            command=["python", "-m", "train", f"--config=cfg/run-{j}.yaml"],
            env=env,
            user=f"user{j % 40}",
            account=f"team-{j % 8}",
            time_limit_s=86_400,
        )
    for j in range(NODES * GPUS + ended):
        node, gpu = divmod(j % (NODES * GPUS), GPUS)
        job = f"job-{j:06d}"
        log.place(job, f"node-{node:03d}", [gpu])
        log.start(job, f"node-{node:03d}")
        if j < ended:
            log.finish(job, f"node-{node:03d}", after=60)
            log.charge(job, seconds=60)
    return fold(log)


def timed(label: str, runs: int, action: object) -> None:
    assert callable(action)
    best = min(_once(action) for _ in range(runs))
    print(f"{label:<28} {best * 1000:8.1f} ms (best of {runs})")


def _once(action: object) -> float:
    assert callable(action)
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def main() -> None:
    jobs = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    started = time.perf_counter()
    state = build(jobs)
    print(
        f"built {len(state.jobs)} jobs at seq {state.seq} in {time.perf_counter() - started:.1f} s"
    )
    data = encode_snapshot(state)
    payload = serialize_state(state)
    print(f"JSON payload {len(payload) / 1e6:8.2f} MB, snapshot (zlib 1) {len(data) / 1e6:.2f} MB")
    for level in (6, 9):
        print(f"  zlib {level}: {len(zlib.compress(payload, level)) / 1e6:.2f} MB")
    print(f"  lzma 0: {len(lzma.compress(payload, preset=0)) / 1e6:.2f} MB")
    timed("encode_snapshot", 5, lambda: encode_snapshot(state))
    timed("decode_snapshot", 5, lambda: decode_snapshot(data))
    timed("  of which JSON serialize", 5, lambda: serialize_state(state))
    timed("  of which zlib 1", 5, lambda: zlib.compress(payload, 1))
    timed("  zlib 6 instead", 3, lambda: zlib.compress(payload, 6))
    timed("  lzma 0 instead", 3, lambda: lzma.compress(payload, preset=0))
    timed("  of which validate JSON", 3, lambda: state_codec().validator.validate_json(payload))
    assert decode_snapshot(data) == state


if __name__ == "__main__":
    main()
