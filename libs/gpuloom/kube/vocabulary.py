"""The names gpuloom reads and writes on Kubernetes objects (docs/kubernetes.md)."""

from __future__ import annotations

#: The extended resource a pod asks for (a count of GPUs, in its limits) and a node
#: offers (its capacity): kube-scheduler hands such pods to the extender.
GPU_RESOURCE = "gpuloom.io/gpu"

# What a pod may ask, in its annotations (each checked: a bad one is the pod's event).
GPU_MILLI = "gpuloom.io/gpu-milli"
POOL = "gpuloom.io/pool"
MODEL = "gpuloom.io/model"
LOCALITY = "gpuloom.io/locality"
ACCOUNT = "gpuloom.io/account"
PRIORITY_CLASS = "gpuloom.io/priority-class"
TIME_LIMIT = "gpuloom.io/time-limit"
TOPOLOGY = "gpuloom.io/topology"
PREEMPTIBLE = "gpuloom.io/preemptible"
GANG = "gpuloom.io/gang"
REPLICAS = "gpuloom.io/replicas"
#: Every annotation of gpuloom's a pod may set; another `gpuloom.io/` one is refused (a
#: typo would otherwise be silently ignored).
ASKED = (
    GPU_MILLI,
    POOL,
    MODEL,
    LOCALITY,
    ACCOUNT,
    PRIORITY_CLASS,
    TIME_LIMIT,
    TOPOLOGY,
    PREEMPTIBLE,
    GANG,
    REPLICAS,
)

# What gpuloom writes on a pod it placed (the device plugin reads them at Allocate).
PLACED_NODE = "gpuloom.io/node"
PLACED_GPUS = "gpuloom.io/gpus"
PLACED_UUIDS = "gpuloom.io/gpu-uuids"
PLACED_MEMORY = "gpuloom.io/gpu-memory-mib"
JOB = "gpuloom.io/job"
ATTEMPT = "gpuloom.io/attempt"
#: A gang's pod: its replica in the job (its place by name among the gang's pods).
REPLICA = "gpuloom.io/replica"
#: Set by the device plugin once it gave the pod's container its GPUs.
ALLOCATED = "gpuloom.io/allocated"
#: Touched by the watcher on a pod gpuloom never heard of (the extender was away), so
#: that kube-scheduler asks about it again at once.
NUDGED = "gpuloom.io/nudged"
WRITTEN = (
    PLACED_NODE,
    PLACED_GPUS,
    PLACED_UUIDS,
    PLACED_MEMORY,
    JOB,
    ATTEMPT,
    REPLICA,
    ALLOCATED,
    NUDGED,
)

# What a Node says of its GPUs, in its labels (or annotations).
NODE_POOL = "gpuloom.io/pool"
NODE_MODEL = "gpuloom.io/model"
NODE_GPU_MEMORY = "gpuloom.io/gpu-memory-mib"
#: Device IDs the device plugin advertises per GPU (so pods can share a vGPU): the
#: node's `gpuloom.io/gpu` capacity is GPUs x split.
NODE_SPLIT = "gpuloom.io/gpu-split"
#: The node's GPUs' UUIDs in index order, comma-separated (an annotation the device
#: plugin writes from NVML): the pods' `gpuloom.io/gpu-uuids` then name real devices.
NODE_UUIDS = "gpuloom.io/gpu-uuids"
#: `true`: the node lends vGPU slices to pods on other nodes (remote vGPU, OrionX's
#: pools): a `local-first` pod may then take a share here while it runs elsewhere.
NODE_LENDS = "gpuloom.io/lends-remote-vgpu"
#: `gpuloom.io/topology-rack: r1`: the node's domain at level `rack`.
TOPOLOGY_PREFIX = "gpuloom.io/topology-"

#: The cordon reason gpuloom gives a node Kubernetes marked unschedulable (so that the
#: watcher lifts only its own cordons, never an operator's).
KUBE_CORDON = "kubernetes: spec.unschedulable (kubectl cordon)"
