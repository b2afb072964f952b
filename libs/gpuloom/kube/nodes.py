"""A Kubernetes Node as gpuloom reads it, and the gpuloom node it is.

A Node offers GPUs to gpuloom when its capacity has `gpuloom.io/gpu` (the device
plugin advertises it: GPUs x `gpuloom.io/gpu-split` device IDs). Its GPUs' pool, model
and memory come from its labels (`gpuloom.io/pool`, `gpuloom.io/model`,
`gpuloom.io/gpu-memory-mib`), its place in the topology from
`gpuloom.io/topology-<level>` labels. A label gpuloom cannot use is a `NodeProblem`:
the watcher skips that node (and says why in its log) rather than guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gpuloom.events import NodeSpec
from gpuloom.events.base import SUBJECT_TOKEN
from gpuloom.events.inventory import GpuSpec, TopologyPlace
from gpuloom.kube.vocabulary import (
    GPU_RESOURCE,
    NODE_GPU_MEMORY,
    NODE_LENDS,
    NODE_MODEL,
    NODE_POOL,
    NODE_SPLIT,
    NODE_UUIDS,
    TOPOLOGY_PREFIX,
)

#: The GPU model a node that names none is given.
UNKNOWN_MODEL = "gpu"
#: A node's GPU memory when its labels name none (the watch of GPU memory is the
#: device's business there; placement divides it for vGPU shares).
DEFAULT_GPU_MEMORY_MIB = 16384
#: The most GPUs one Kubernetes node may offer (NodeSpec's bound).
NODE_GPUS_MOST = 1024
#: The most device IDs the device plugin may advertise per GPU.
SPLIT_MOST = 100


@dataclass(frozen=True, slots=True)
class NodeProblem:
    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class KubeNode:
    """What gpuloom needs of one Node that offers `gpuloom.io/gpu`."""

    name: str
    spec: NodeSpec | None
    ready: bool
    unschedulable: bool
    problem: NodeProblem | None = None


def gpuloom_name(kube_name: str) -> str | None:
    """The gpuloom node of a Kubernetes node: its name with `.` as `_` (a node is a
    subject token in gpuloom; `_` never stands in a Kubernetes name, so the mapping goes
    both ways), or None when it is too long for one (63 characters)."""
    name = kube_name.replace(".", "_")
    return name if SUBJECT_TOKEN.fullmatch(name) else None


def kube_name(node: str) -> str:
    """The Kubernetes node of a gpuloom node (`gpuloom_name` undone)."""
    return node.replace("_", ".")


def read_node(obj: dict[str, Any]) -> KubeNode | None:
    """The node in an API object, or None when it offers no `gpuloom.io/gpu` (not
    gpuloom's to schedule)."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    spec = obj.get("spec") or {}
    capacity = status.get("capacity") or {}
    if GPU_RESOURCE not in capacity:
        return None
    name = gpuloom_name(str(meta.get("name") or ""))
    if name is None:
        return None
    annotations, own = meta.get("annotations") or {}, meta.get("labels") or {}
    labels = {str(k): str(v) for k, v in {**annotations, **own}.items()}
    # the node's labels as gpuloom keeps them: its own gpuloom.io/ labels (what a label may
    # hold: 63 characters), never an annotation (the UUIDs of eight GPUs are longer)
    kept = {str(k): str(v) for k, v in own.items() if str(k).startswith("gpuloom.io/")}
    ready = any(
        isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    unschedulable = bool(spec.get("unschedulable"))
    try:
        node_spec = _node_spec(name, str(capacity[GPU_RESOURCE]), labels, kept)
    except _Bad as bad:
        return KubeNode(name, None, ready, unschedulable, NodeProblem(name, bad.reason))
    except ValidationError as exc:
        reason = str(exc.errors()[0]["msg"])
        return KubeNode(name, None, ready, unschedulable, NodeProblem(name, reason))
    return KubeNode(name, node_spec, ready, unschedulable)


class _Bad(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _node_spec(name: str, capacity: str, labels: dict[str, str], kept: dict[str, str]) -> NodeSpec:
    split = _whole(labels.get(NODE_SPLIT, "1"), NODE_SPLIT, 1, SPLIT_MOST)
    devices = _quantity(capacity, f"capacity {GPU_RESOURCE}", NODE_GPUS_MOST * SPLIT_MOST)
    count = devices // split
    if count > NODE_GPUS_MOST:
        raise _Bad(f"{count} GPUs: at most {NODE_GPUS_MOST}")
    pool = labels.get(NODE_POOL, "physical")
    if pool not in ("physical", "vgpu"):
        raise _Bad(f"label {NODE_POOL} must be physical or vgpu, not {pool[:40]!r}")
    model = labels.get(NODE_MODEL) or UNKNOWN_MODEL
    memory_text = labels.get(NODE_GPU_MEMORY, str(DEFAULT_GPU_MEMORY_MIB))
    memory = _whole(memory_text, NODE_GPU_MEMORY, 1, 2**31 - 1)
    uuids = [u.strip() for u in labels.get(NODE_UUIDS, "").split(",") if u.strip()]
    if len(uuids) != count:  # the device plugin writes them; else stand-ins
        uuids = [f"{name}-gpu{index}"[:100] for index in range(count)]
    topology = [
        TopologyPlace(level=key[len(TOPOLOGY_PREFIX) :], domain=value)
        for key, value in sorted(labels.items())
        if key.startswith(TOPOLOGY_PREFIX)
    ]
    lends = labels.get(NODE_LENDS, "false")
    if lends not in ("true", "false"):
        raise _Bad(f"label {NODE_LENDS} must be true or false, not {lends[:40]!r}")
    return NodeSpec(
        lends_remote_vgpu=lends == "true",
        gpus=[
            GpuSpec(
                index=index,
                uuid=uuids[index],
                model=model,
                memory_mib=memory,
                pool=pool,
            )
            for index in range(count)
        ],
        labels=dict(sorted(kept.items())),
        runtimes=["kubernetes"],
        topology=topology,
    )


#: The decimal and binary suffixes of a Kubernetes quantity a whole count may carry: the
#: API writes 2000 as `2k`.
_SUFFIXES = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def _quantity(text: str, what: str, most: int) -> int:
    """A whole count written as a Kubernetes quantity (`8`, `2k`), from 0 to `most`."""
    found = re.fullmatch(r"([0-9]{1,9})(k|M|G|Ki|Mi|Gi)?", str(text).strip())
    if found is None:
        raise _Bad(f"{what} must be a whole number, not {str(text)[:40]!r}")
    value = int(found[1]) * _SUFFIXES[found[2] or ""]
    if value > most:
        raise _Bad(f"{what} must be at most {most}, not {value}")
    return value


def _whole(text: str, what: str, least: int, most: int) -> int:
    if not re.fullmatch(r"[0-9]{1,9}", str(text).strip()):
        raise _Bad(f"{what} must be a whole number, not {str(text)[:40]!r}")
    value = int(text)
    if not least <= value <= most:
        raise _Bad(f"{what} must be from {least} to {most}, not {value}")
    return value
