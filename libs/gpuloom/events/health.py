"""GPU health: a GPU that fails a health check leaves placement until an operator
returns it (docs/faults.md).

The agent of the GPU's node writes `GpuUnhealthy` with what it saw (an Xid error, ECC
errors, retired pages pending, a GPU that stopped answering; on a simulated node, a
fault injected for tests and drills). Every job with a replica on that GPU is then
stopped, its checkpoint signal first, and requeued ahead of its priority class
(expedited requeue, as Slurm 25.11's). An operator writes `GpuHealthy` through the
gateway (`gpuloom gpus resume`) once the GPU is repaired or found sound.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from gpuloom.events.base import NodeEvent
from gpuloom.events.text import Remark, UserName

#: What the agent saw: `xid` (a critical Xid error, as DCGM's and NVSentinel's), `ecc`
#: (uncorrected ECC errors past the threshold), `retired_pages` (a page retirement
#: pending, cleared only by a GPU reset), `unresponsive` (NVML lost the GPU, or it
#: stopped answering), `injected` (a simulated node's fault, for tests and drills).
HealthCheck = Literal["xid", "ecc", "retired_pages", "unresponsive", "injected"]

#: The Xid errors that take a GPU out of service (NVIDIA's Xid catalogue: those that
#: need a reset or a reboot, or mean the GPU or its memory failed): 48 double-bit ECC,
#: 61/62 internal micro-controller halt, 63/64 row remapping, 74 NVLink, 79 fallen off
#: the bus, 92 high single-bit ECC rate, 94/95 contained/uncontained ECC, 119/120 GSP.
CRITICAL_XIDS: tuple[int, ...] = (48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120)


class GpuUnhealthy(NodeEvent):
    """A GPU of the node failed a health check: no job is placed on it again until an
    operator resumes it, and every job with a replica on it is stopped and requeued."""

    TYPE: ClassVar[str] = "GpuUnhealthy"
    index: int = Field(ge=0, le=1023)
    #: The GPU's UUID as the agent found it: a replaced GPU is another GPU.
    uuid: UserName
    check: HealthCheck
    #: What was seen, for people: `Xid 79: GPU has fallen off the bus`.
    evidence: Remark = ""


class GpuHealthy(NodeEvent):
    """An operator returned the GPU to service (`gpuloom gpus resume`)."""

    TYPE: ClassVar[str] = "GpuHealthy"
    index: int = Field(ge=0, le=1023)
    reason: Remark = ""
