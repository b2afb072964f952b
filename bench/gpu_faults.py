"""From a GPU fault to the job running again elsewhere (issue #40's target: at most 20 s
on the simulated stack), on a real stack: NATS, SQLite, every service a process of its
own, 2 agents x 2 simulated nodes x 8 GPUs, the services' default settings.

Each round: a one-GPU job (`sleep 600`, which ends at SIGTERM) runs; a fault is injected on its
GPU (the file simulated agents read, as NVML's Xid would reach a real agent); the
round measures, from the log's own timestamps, the fault's detection (the injection to
GpuUnhealthy), the stop (to the attempt's JobFinished), the new placement and the new
start. The GPU is then resumed (GpuHealthy) for the next round.

  python bench/gpu_faults.py [--rounds N] [--env GPULOOM_SETTING=VALUE ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from gpuloom.events import GpuUnhealthy, JobFinished, JobPlaced, JobStarted
from gpuloom.testing.cluster import SimNode, simulated_cluster

NODES = {
    "agent-a": [SimNode("node-a", "A100-80GB", 8), SimNode("node-b", "A100-80GB", 8)],
    "agent-b": [SimNode("node-c", "A100-80GB", 8), SimNode("node-d", "A100-80GB", 8)],
}


def wait(predicate: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise TimeoutError("round did not complete")


def running_again(job: dict[str, object]) -> bool:
    return job["attempt"] == 2 and job["state"] == "running"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.env)
    with (
        tempfile.TemporaryDirectory() as base,
        simulated_cluster(Path(base), NODES, agent_env={name: env for name in NODES}) as cluster,
    ):
        rows = []
        for number in range(args.rounds):
            job_id = cluster.submit(name=f"victim-{number}", command=["sleep", "600"])
            cluster.wait_state([job_id], "running")
            job = cluster.job(job_id)
            node, [index] = job["node"], job["gpus"]
            injected = datetime.now(UTC)
            cluster.inject_faults((node, index, "xid", "Xid 79: GPU has fallen off the bus"))
            wait(lambda job_id=job_id: running_again(cluster.job(job_id)), 60)
            records = cluster.read_log()
            fault = next(
                r for r in reversed(records)
                if isinstance(r.event, GpuUnhealthy) and (r.event.node, r.event.index) == (node, index)
            )  # fmt: skip
            of_job = [r for r in records if getattr(r.event, "job_id", None) == job_id]
            stopped = next(r for r in of_job if isinstance(r.event, JobFinished))
            placed = [r for r in of_job if isinstance(r.event, JobPlaced)][-1]
            started = [r for r in of_job if isinstance(r.event, JobStarted)][-1]
            seen = (fault.envelope.at - injected).total_seconds()
            rows.append(
                (
                    seen,
                    (stopped.envelope.at - fault.envelope.at).total_seconds(),
                    (placed.envelope.at - stopped.envelope.at).total_seconds(),
                    (started.envelope.at - placed.envelope.at).total_seconds(),
                    (started.envelope.at - injected).total_seconds(),
                )
            )
            cluster.inject_faults()
            time.sleep(2.5)  # the agents look every second: they see it repaired
            resumed = cluster.http.post(f"/v1/nodes/{node}/gpus/{index}/resume", json={})
            assert resumed.status_code == 202, resumed.text
            cluster.http.delete(f"/v1/jobs/{job_id}")
            cluster.wait_final([job_id])
        print("round  detected  stopped  placed  started  fault-to-running (s)")
        for number, row in enumerate(rows):
            print(f"{number:5d}  " + "  ".join(f"{value:7.2f}" for value in row))
        totals = [row[-1] for row in rows]
        print(
            f"fault to running again elsewhere: median {statistics.median(totals):.2f} s, "
            f"max {max(totals):.2f} s over {len(totals)} rounds (target: at most 20 s)"
        )


if __name__ == "__main__":
    sys.exit(main())
