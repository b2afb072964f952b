"""GPU health: what the agent watches on each GPU, and the GpuUnhealthy it writes.

A probe says which GPUs have a fault now, by UUID (`HealthProbe.faults`):

- `NvmlHealth`, on a machine with NVIDIA's driver: critical Xid errors (NVML's event
  set, as DCGM's health watches and NVSentinel read them; the Xids are
  `agent_health_xids`, by default `gpuloom.events.health.CRITICAL_XIDS`), uncorrected volatile ECC errors past
  `agent_health_ecc_errors`, a page retirement pending (only a GPU reset clears it),
  and a GPU that stopped answering (NVML: GPU lost). An Xid is an event: once seen, the
  GPU stays faulty for this agent's life.
- `InjectedFaults`, on simulated nodes: the faults listed in a YAML file the agent
  reads again whenever it changes (`agent_faults_file`, by default `faults.yaml` in
  the agent's run folder), so that tests and drills take the path a real fault takes:

  ```yaml
  - {node: node-a, index: 0, check: xid, evidence: "Xid 79: GPU has fallen off the bus"}
  ```

`new_faults` (pure) turns what a probe says into the GpuUnhealthy events not written
yet by this agent. The fold voids a repeat (a restarted agent sees the same fault
again), and an operator's `gpuloom gpus resume` returns the GPU (GpuHealthy); the agent
writes GpuUnhealthy again for a GPU once its probe saw it without a fault in between
(an Xid's fault lasts until the agent restarts: it was resumed knowingly).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, get_args

import yaml

from gpuloom.events import Decision, GpuUnhealthy, HealthCheck, NodeSpec, intents
from gpuloom.events.sanitize import printable

log = logging.getLogger(__name__)

#: How long a round waits for the probe before it goes on (the probe goes on asking).
PROBE_WAIT_S = 0.2

#: The most evidence text an event carries (`Remark`).
EVIDENCE_MOST = 500


@dataclass(frozen=True, slots=True)
class Fault:
    check: HealthCheck
    evidence: str


class HealthProbe(Protocol):
    def faults(self) -> Mapping[str, Fault]:
        """GPU UUID -> its fault, for every GPU that has one now."""
        ...


def new_faults(
    nodes: Sequence[tuple[str, NodeSpec]],
    faults: Mapping[str, Fault],
    reported: set[tuple[str, int, str]],
    now_ms: int,
) -> list[Decision]:
    """The GpuUnhealthy events for the faults on `nodes` not yet in `reported` (which
    it updates: a GPU whose fault is gone leaves it, so that its next fault is reported
    again), in node and index order. Each is keyed by the moment this agent saw it
    (`now_ms`): a GPU that fails again after an operator resumed it is a new fact, and
    JetStream's de-duplication must not drop it."""
    reported.difference_update({key for key in reported if key[2] not in faults})
    decisions = []
    for name, spec in sorted(nodes, key=lambda pair: pair[0]):
        for gpu in sorted(spec.gpus, key=lambda g: g.index):
            fault = faults.get(gpu.uuid)
            key = (name, gpu.index, gpu.uuid)
            if fault is None or key in reported:
                continue
            event = GpuUnhealthy(
                node=name,
                index=gpu.index,
                uuid=gpu.uuid,
                check=fault.check,
                # what a driver or a file says, made text an event holds: never refused
                evidence=printable(fault.evidence, EVIDENCE_MOST),
            )
            reported.add(key)  # once its event exists: a fault is never dropped unsaid
            decisions.append(Decision(event, intents.gpu_unhealthy(name, gpu.index, now_ms)))
            log.warning("GPU %s/%d (%s) failed: %s", name, gpu.index, gpu.uuid, event.evidence)
    return decisions


@dataclass
class HealthWatch:
    """The agent's health checks of `nodes`: `probe` asked at most every `interval_s`
    (the agent's monotonic clock), the faults it has reported kept."""

    probe: HealthProbe
    nodes: Sequence[tuple[str, NodeSpec]]
    interval_s: float = 1.0
    reported: set[tuple[str, int, str]] = field(default_factory=set)
    _checked: float | None = None
    #: The probe being asked, in a thread: a lost GPU can make NVML answer in seconds,
    #: or never, and the agent's loop (heartbeats, starts, stops) must not wait on it.
    _asking: asyncio.Future[Mapping[str, Fault]] | None = None

    async def check(self, now: float) -> list[Decision]:
        """The GpuUnhealthy events of the faults the last finished probe found (none if
        it is not time yet, or a probe is still being asked: never two at once); a
        probe that fails is logged and asked again next time."""
        asking = self._asking
        if asking is None:
            if self._checked is not None and now - self._checked < self.interval_s:
                return []
            self._checked = now
            asking = self._asking = asyncio.ensure_future(asyncio.to_thread(self.probe.faults))
            await asyncio.wait({asking}, timeout=PROBE_WAIT_S)  # most answer at once
        if not asking.done():
            return []  # still asking: the next round looks again
        self._asking = None
        try:
            faults = asking.result()
        except Exception:
            log.exception("GPU health check failed; tried again in %g s", self.interval_s)
            return []
        return new_faults(self.nodes, faults, self.reported, now_ms())


class InjectedFaults:
    """A simulated node's faults, from a YAML file (module doc); read again when its
    modification time or size changes. A missing file is no fault; a bad one is logged
    and taken as no fault, so that a typo never stops the agent."""

    def __init__(self, path: Path, nodes: Sequence[tuple[str, NodeSpec]]) -> None:
        self.path = path
        self._uuids = {(name, g.index): g.uuid for name, spec in nodes for g in spec.gpus}
        self._seen: tuple[int, int] | None = None
        self._faults: dict[str, Fault] = {}

    def faults(self) -> Mapping[str, Fault]:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._seen, self._faults = None, {}
            return self._faults
        seen = (stat.st_mtime_ns, stat.st_size)
        if seen != self._seen:
            self._seen = seen
            self._faults = self._read()
        return self._faults

    def _read(self) -> dict[str, Fault]:
        try:
            entries = yaml.safe_load(self.path.read_text()) or []
            return dict(self._parse(entries))
        except (OSError, yaml.YAMLError, ValueError, TypeError, KeyError) as exc:
            log.error("fault file %s not read (no fault taken from it): %s", self.path, exc)
            return {}

    def _parse(self, entries: Any) -> Iterable[tuple[str, Fault]]:
        if not isinstance(entries, list):
            raise ValueError("a list of faults, each {node, index, check, evidence}")
        for entry in entries:
            uuid = self._uuids.get((str(entry["node"]), int(entry["index"])))
            if uuid is None:
                continue  # another agent's node, or no such GPU
            check = entry.get("check", "injected")
            if check not in get_args(HealthCheck):
                raise ValueError(f"check {check!r} is not one of {get_args(HealthCheck)}")
            yield uuid, Fault(check, str(entry.get("evidence", "")))


class NvmlHealth:
    """The faults NVML reports on this machine's GPUs (module doc). Built only where
    NVML initialises; `nvml` is pynvml (a stand-in in tests)."""

    def __init__(self, nvml: Any, xids: Sequence[int], ecc_errors: int) -> None:
        self._nvml = nvml
        self._xids = frozenset(xids)
        self._ecc_errors = ecc_errors
        count = nvml.nvmlDeviceGetCount()
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self._uuids = [_text(nvml.nvmlDeviceGetUUID(h)) for h in self._handles]
        #: Xids are events: a GPU that had a critical one keeps its fault.
        self._sticky: dict[str, Fault] = {}
        self._events = nvml.nvmlEventSetCreate()
        for handle in self._handles:
            try:
                nvml.nvmlDeviceRegisterEvents(
                    handle, nvml.nvmlEventTypeXidCriticalError, self._events
                )
            except nvml.NVMLError as exc:  # not supported on this GPU: its checks still run
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                log.warning("GPU %s: no Xid events from NVML: %s", uuid, exc)

    def faults(self) -> Mapping[str, Fault]:
        self._read_xids()
        found = dict(self._sticky)
        for handle, uuid in zip(self._handles, self._uuids, strict=True):
            if uuid not in found:
                fault = self._check(handle)
                if fault is not None:
                    found[uuid] = fault
        return found

    def _read_xids(self) -> None:
        nvml = self._nvml
        while True:
            try:
                event = nvml.nvmlEventSetWait_v2(self._events, 0)
            except nvml.NVMLError:  # timeout: nothing more now
                return
            xid = int(event.eventData)
            uuid = self._uuid_of(event.device)
            if xid in self._xids and uuid is not None:
                self._sticky.setdefault(uuid, Fault("xid", f"Xid {xid}"))

    def _uuid_of(self, device: Any) -> str | None:
        try:
            return _text(self._nvml.nvmlDeviceGetUUID(device))
        except self._nvml.NVMLError:
            return None

    def _check(self, handle: Any) -> Fault | None:
        nvml = self._nvml
        try:
            errors = nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            )
        except nvml.NVMLError_GpuIsLost as exc:
            return Fault("unresponsive", f"NVML: {exc}")
        except nvml.NVMLError:
            errors = 0  # no ECC on this GPU
        if errors > self._ecc_errors:
            return Fault("ecc", f"{errors} uncorrected ECC errors (volatile)")
        try:
            pending = nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)
        except nvml.NVMLError_GpuIsLost as exc:
            return Fault("unresponsive", f"NVML: {exc}")
        except nvml.NVMLError:
            return None
        if pending == nvml.NVML_FEATURE_ENABLED:
            return Fault("retired_pages", "a page retirement is pending (needs a GPU reset)")
        return None


def nvml_health(xids: Sequence[int], ecc_errors: int) -> NvmlHealth | None:
    """The NVML health probe, or None where pynvml is missing or NVML does not answer."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return NvmlHealth(pynvml, xids, ecc_errors)
    except Exception as exc:  # ImportError, pynvml.NVMLError
        log.info("GPU health checks off: %s", exc)
        return None


def now_ms() -> int:
    """The agent's wall clock in ms: only the key of a fault it saw (`new_faults`)."""
    return time.time_ns() // 1_000_000


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
