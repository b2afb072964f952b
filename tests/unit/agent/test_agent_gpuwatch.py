"""The GPU memory watch: a job over its slice's memory is stopped as GpuMemoryExceeded."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path

from gpuloom.events import JobSpec, SliceRef
from services.agent.gpuwatch import REASON, Limit, memory_limits, over_limit
from services.agent.outcomes import Exited, Started
from services.agent.reconcile import Ensure
from services.agent.runner import Runner
from services.agent.shim import RunDir


def test_over_limit_adds_up_a_jobs_processes_per_gpu() -> None:
    limits = {("j1", 1, 0): Limit(100, {"GPU-a": 1000}), ("j2", 1, 0): Limit(200, {"GPU-a": 500})}
    groups = {101: 100, 102: 100, 201: 200, 999: 999}
    usage = {101: {"GPU-a": 600}, 102: {"GPU-a": 500}, 201: {"GPU-a": 400}, 999: {"GPU-a": 9000}}
    found = over_limit(usage, limits, groups)
    assert list(found) == [("j1", 1, 0)]
    assert found[("j1", 1, 0)] == f"{REASON}: 1100 MiB used on GPU GPU-a, the slice allows 1000 MiB"
    # within the slice, or on another GPU, or an unknown process: nothing to stop
    assert over_limit({101: {"GPU-b": 5000}}, limits, groups) == {}
    assert over_limit({555: {"GPU-a": 5000}}, limits, groups) == {}


def fraction(job_id: str, memory_mib: int) -> Ensure:
    spec = JobSpec(
        name=job_id, user="u", account="a", command=["sleep", "30"], gpus=1, gpu_milli=250
    )
    piece = SliceRef(node="node-a", index=0, uuid="GPU-0", milli=250, memory_mib=memory_mib)
    return Ensure(
        job_id=job_id,
        attempt=1,
        node="node-a",
        phase="placed",
        spec=spec,
        gpu_indexes=(0,),
        gpu_uuids=("GPU-0",),
        started_at=None,
        slices=(piece,),
    )


def test_only_local_fractions_are_limited() -> None:
    action = fraction("j", 2048)
    assert memory_limits(action) == {"GPU-0": 2048}
    whole = SliceRef(node="node-a", index=1, uuid="GPU-1", milli=1000, memory_mib=0)
    remote = SliceRef(node="node-b", index=0, uuid="GPU-b0", milli=250, memory_mib=10)
    mixed = (
        Ensure(**{**action.__dict__, "slices": (whole, remote)})
        if hasattr(action, "__dict__")
        else None
    )
    if mixed is not None:
        assert memory_limits(mixed) == {}


class FakeNvml:
    """Reports that the group of `pid` uses `mib` on GPU-0."""

    def __init__(self) -> None:
        self.readings: dict[int, dict[str, int]] = {}

    def usage(self) -> Mapping[int, Mapping[str, int]]:
        return self.readings


async def test_a_job_over_its_gpu_memory_is_stopped_and_fails(run_root: Path) -> None:
    probe = FakeNvml()
    exits: list[Exited] = []
    runner = Runner(run_root, exits.append, grace_s=0.5, poll_s=0.02, environ={}, probe=probe)
    action = fraction("greedy", 2048)
    result = runner.ensure(action)
    assert isinstance(result, Started)
    run = RunDir(runner.root, "node-a", *action.key)
    while run.read_pid() is None:
        time.sleep(0.005)
    probe.readings = {result.pid: {"GPU-0": 1024}}  # within its 2 GiB: keeps running
    runner.poll()
    await asyncio.sleep(1.1)
    runner.poll()
    assert exits == []
    probe.readings = {result.pid: {"GPU-0": 4096}}
    deadline = time.monotonic() + 8
    while not exits and time.monotonic() < deadline:
        runner.poll()
        await asyncio.sleep(0.05)
    [exited] = exits
    assert exited.ended.outcome == "failed"
    assert exited.ended.reason is not None and exited.ended.reason.startswith(REASON)
    assert "4096 MiB used on GPU GPU-0" in exited.ended.reason
