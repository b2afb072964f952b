"""Whether a GPU can give one slice of a job, and a node can host one of its replicas.

One rule, two users: the fold checks a recorded placement with it
(`gpuloom.state.rules.assignment.assignment_problem`), and the engine makes placements with
it (`gpuloom.placement.resources.gpu_serves`, `host_fits`; the engine's hot path,
`fits_locally`, is them written out, and tests hold it to them). It lives in the state
layer, the lowest that both import, and reads plain values: the fold has `GpuState`
and `NodeState`, the engine its views, so neither's types leak into the other.

Each rule answers with the reason it refuses (a phrase about the GPU or the host,
which the fold puts after "GPU n1/0" or "host n1") or None.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gpuloom.events.units import MILLI_PER_GPU

#: The reason `gpu_room_refusal` gives a whole GPU something else holds: the fold
#: names the holder instead.
HELD = "is held"


def gpu_kind_refusal(
    models: Sequence[str],
    pool: str,
    share_milli: int,
    gpu_model: str,
    gpu_pool: str,
    gpu_memory_mib: int,
    whole_memory_mib: int | None = None,
) -> str | None:
    """What the GPU is, whatever holds it: one of the `models` asked (any, when none),
    in the `pool` asked ("any" takes either), a fraction only from the vgpu pool, and for
    a whole GPU at least `whole_memory_mib` of memory, if asked."""
    if models and gpu_model not in models:
        return f"is a {gpu_model}, not {list(models)}"
    if pool != "any" and gpu_pool != pool:
        return f"is in the {gpu_pool} pool, not {pool}"
    if share_milli < MILLI_PER_GPU:
        if gpu_pool != "vgpu":
            return "is physical: fractions come from vgpu"
    elif whole_memory_mib is not None and whole_memory_mib > gpu_memory_mib:
        return f"has {gpu_memory_mib} MiB of memory, the job asks {whole_memory_mib}"
    return None


def gpu_room_refusal(
    share_milli: int, memory_mib: int, milli_free: int, memory_free_mib: int, gpu_memory_mib: int
) -> str | None:
    """What is free on the GPU now: a whole GPU must be idle (`HELD`), a fraction needs
    its share and `memory_mib` of memory free."""
    if share_milli >= MILLI_PER_GPU:
        if milli_free < MILLI_PER_GPU or memory_free_mib < gpu_memory_mib:
            return HELD
        return None
    if milli_free < share_milli or memory_free_mib < memory_mib:
        return "has not enough free share or memory"
    return None


#: The runtime a Kubernetes node names (`NodeSpec.runtimes`): its kubelet runs pods.
KUBERNETES = "kubernetes"


def runtime_refusal(kubernetes: bool, runtimes: Sequence[str]) -> str | None:
    """A job that stands for Kubernetes pods runs only on a Kubernetes node (its kubelet
    starts the pods), and a Kubernetes node runs nothing else (no gpuloom agent serves
    it): why not, or None."""
    on_kubernetes = KUBERNETES in runtimes
    if kubernetes and not on_kubernetes:
        return "is not a Kubernetes node, and the job is a Kubernetes pod"
    if not kubernetes and on_kubernetes:
        return "is a Kubernetes node: it runs only pods that kube-scheduler asks gpuloom to place"
    return None


def host_refusal(
    cpu_milli: int,
    memory_mib: int,
    cpu_free_milli: int | None,
    memory_free_mib: int | None,
    node_selector: Iterable[tuple[str, str]],
    labels: Mapping[str, str],
    wants_runtime: bool,
    runtimes: Sequence[str],
    *,
    kubernetes: bool = False,
) -> str | None:
    """What a replica's host must have, GPUs aside: the labels of the node selector, a
    container runtime for an image, Kubernetes for a pod and nothing else on a
    Kubernetes node, and the replica's CPU and memory free (a node that declares none
    is not bounded by them: None)."""
    if any(labels.get(key) != value for key, value in node_selector):
        return "does not match the node selector"
    if wants_runtime and not runtimes:
        return "has no container runtime for the image"
    refused = runtime_refusal(kubernetes, runtimes)
    if refused is not None:
        return refused
    if cpu_free_milli is not None and cpu_free_milli < cpu_milli:
        return "has not enough free CPU"
    if memory_free_mib is not None and memory_free_mib < memory_mib:
        return "has not enough free memory"
    return None


def topology_refusal(level: str, domains: Mapping[str, str | None]) -> str | None:
    """A job that must be inside one domain of `level`: every node it uses (node name ->
    its domain at `level`, None where it names none) is in the same one."""
    outside = sorted(node for node, domain in domains.items() if domain is None)
    if outside:
        return f"node(s) {', '.join(outside)} name no {level}"
    found = sorted(set(domains.values()), key=str)
    if len(found) > 1:
        return f"its nodes span {len(found)} {level} domains ({', '.join(map(str, found))})"
    return None
