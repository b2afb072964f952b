"""The agent's GPU health checks (`services.agent.health`, issue #40): a simulated
node's injected faults, NVML's (a stand-in here: no GPU on this machine), and the
GpuUnhealthy events made of them, each written once."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpuloom.events import GpuSpec, GpuUnhealthy, NodeSpec
from gpuloom.events.health import CRITICAL_XIDS
from services.agent.health import Fault, HealthWatch, InjectedFaults, NvmlHealth, new_faults


def spec(node: str, count: int = 2) -> NodeSpec:
    gpus = [
        GpuSpec(index=i, uuid=f"GPU-{node}-{i}", model="A100", memory_mib=1024)
        for i in range(count)
    ]
    return NodeSpec(gpus=gpus, simulated=True)


NODES = [("node-b", spec("node-b")), ("node-a", spec("node-a"))]


def test_each_fault_becomes_one_event_in_node_and_index_order() -> None:
    reported: set[tuple[str, int, str]] = set()
    faults = {
        "GPU-node-b-0": Fault("xid", "Xid 79"),
        "GPU-node-a-1": Fault("ecc", "3 uncorrected"),
        "GPU-elsewhere": Fault("xid", "Xid 48"),
    }
    first = new_faults(NODES, faults, reported, 1000)
    events = [d.event for d in first]
    assert events == [
        GpuUnhealthy(node="node-a", index=1, uuid="GPU-node-a-1", check="ecc", evidence="3 uncorrected"),
        GpuUnhealthy(node="node-b", index=0, uuid="GPU-node-b-0", check="xid", evidence="Xid 79"),
    ]  # fmt: skip
    assert [d.msg_id for d in first] == [
        "node-a:gpu-unhealthy:1:1000",
        "node-b:gpu-unhealthy:0:1000",
    ]
    assert new_faults(NODES, faults, reported, 2000) == [], "reported once"
    del faults["GPU-node-b-0"]  # repaired (an operator resumes it), then it fails again
    assert new_faults(NODES, faults, reported, 3000) == []
    faults["GPU-node-b-0"] = Fault("xid", "Xid 48")
    assert [d.msg_id for d in new_faults(NODES, faults, reported, 4000)] == [
        "node-b:gpu-unhealthy:0:4000"
    ]


def test_injected_faults_are_read_again_when_the_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "faults.yaml"
    probe = InjectedFaults(path, NODES)
    assert probe.faults() == {}, "no file: no fault"
    path.write_text(
        '- {node: node-a, index: 0, check: xid, evidence: "Xid 79"}\n- {node: zz, index: 0}\n'
    )
    assert probe.faults() == {"GPU-node-a-0": Fault("xid", "Xid 79")}
    path.write_text("- {node: node-b, index: 1}\n")
    os.utime(path, ns=(1, 10**18))  # a new modification time, whatever the clock's grain
    assert probe.faults() == {"GPU-node-b-1": Fault("injected", "")}
    path.unlink()
    assert probe.faults() == {}


def test_a_bad_fault_file_is_logged_and_taken_as_no_fault(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "faults.yaml"
    path.write_text("- {node: node-a, index: 0, check: melted}\n")
    assert InjectedFaults(path, NODES).faults() == {}
    assert "check 'melted' is not one of" in caplog.text


class FakeNvml:
    """The few pynvml calls the health probe makes, over two GPUs."""

    NVMLError = type("NVMLError", (Exception,), {})
    NVMLError_GpuIsLost = type("NVMLError_GpuIsLost", (NVMLError,), {})
    nvmlEventTypeXidCriticalError = 8
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_FEATURE_ENABLED = 1

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.ecc = {0: 0, 1: 0}
        self.pending = {0: 0, 1: 0}
        self.lost: set[int] = set()

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        return f"GPU-real-{handle}".encode()

    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlDeviceRegisterEvents(self, handle: int, kinds: int, events: str) -> None:
        pass

    def nvmlEventSetWait_v2(self, events: str, timeout_ms: int) -> Any:
        if not self.events:
            raise self.NVMLError("timeout")
        return self.events.pop(0)

    def nvmlDeviceGetTotalEccErrors(self, handle: int, kind: int, counter: int) -> int:
        if handle in self.lost:
            raise self.NVMLError_GpuIsLost("GPU is lost")
        return self.ecc[handle]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: int) -> int:
        return self.pending[handle]


def test_nvml_faults_critical_xids_stay_ecc_and_pages_and_a_lost_gpu() -> None:
    nvml = FakeNvml()
    probe = NvmlHealth(nvml, CRITICAL_XIDS, ecc_errors=0)
    assert probe.faults() == {}
    nvml.events = [SimpleNamespace(eventData=13, device=0), SimpleNamespace(eventData=79, device=1)]
    assert probe.faults() == {"GPU-real-1": Fault("xid", "Xid 79")}, "Xid 13 is the program's"
    assert probe.faults() == {"GPU-real-1": Fault("xid", "Xid 79")}, "an Xid's fault stays"
    nvml.ecc[0] = 2
    assert probe.faults()["GPU-real-0"] == Fault("ecc", "2 uncorrected ECC errors (volatile)")
    nvml.ecc[0], nvml.pending[0] = 0, 1
    assert probe.faults()["GPU-real-0"].check == "retired_pages"
    nvml.pending[0] = 0
    nvml.lost.add(0)
    assert probe.faults()["GPU-real-0"] == Fault("unresponsive", "NVML: GPU is lost")
    assert NvmlHealth(FakeNvml(), CRITICAL_XIDS, ecc_errors=5)._check(0) is None


async def test_the_watch_asks_its_probe_at_most_once_per_interval() -> None:
    asked: list[int] = []

    class Probe:
        def faults(self) -> dict[str, Fault]:
            asked.append(1)
            return {"GPU-node-a-0": Fault("injected", "drill")}

    watch = HealthWatch(Probe(), NODES, interval_s=1.0)
    assert len(await watch.check(10.0)) == 1
    assert await watch.check(10.5) == [] and len(asked) == 1
    assert await watch.check(11.0) == [] and len(asked) == 2, "asked again, reported already"


async def test_a_probe_that_hangs_never_holds_up_the_agents_round() -> None:
    """A lost GPU can make NVML slow: the round goes on, one probe at a time, and the
    fault is reported once the probe answers."""
    release = threading.Event()
    asked: list[int] = []

    class Slow:
        def faults(self) -> dict[str, Fault]:
            asked.append(1)
            release.wait(5)
            return {"GPU-node-a-0": Fault("unresponsive", "NVML: GPU is lost")}

    watch = HealthWatch(Slow(), NODES, interval_s=0.0)
    began = time.monotonic()
    assert await watch.check(1.0) == [] and await watch.check(2.0) == []
    assert time.monotonic() - began < 1.0 and asked == [1], "not waited on, not asked twice"
    release.set()
    for _ in range(100):
        found = await watch.check(3.0)
        if found:
            break
        await asyncio.sleep(0.01)
    assert [d.event.check for d in found] == ["unresponsive"]  # type: ignore[attr-defined]


def test_evidence_with_control_characters_is_reported_as_text() -> None:
    faults = {"GPU-node-a-0": Fault("xid", "Xid 79\n\x1b[31mred" + "x" * 600)}
    [decision] = new_faults(NODES, faults, set(), 1)
    evidence = decision.event.evidence  # type: ignore[attr-defined]
    assert evidence.startswith("Xid 79??[31mred") and len(evidence) == 500
