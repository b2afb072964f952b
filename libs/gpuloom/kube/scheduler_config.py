"""kube-scheduler's configuration for gpuloom's extender: the `extenders:` stanza that
`make run` prints and the tests' control plane uses (docs/kubernetes.md)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from gpuloom.kube.vocabulary import GPU_RESOURCE


def scheduler_config_stanza(
    extender_url: str,
    *,
    http_timeout: str = "5s",
    managed_resources: Sequence[str] = (GPU_RESOURCE,),
    weight: int = 1,
    ignorable: bool = False,
    node_cache_capable: bool = True,
    filter_verb: str = "filter",
    prioritize_verb: str = "prioritize",
    bind_verb: str = "bind",
) -> str:
    """The `extenders:` stanza of a KubeSchedulerConfiguration that sends kube-scheduler's
    filter, prioritize and bind for the pods asking for `managed_resources` to the
    extender at `extender_url` (it POSTs `extender_url + "/" + verb`). The scheduler does
    no accounting of those resources (`ignoredByScheduler`): the extender does.
    `nodeCacheCapable`: the scheduler sends node names, not whole Node objects (the
    extender knows the nodes from its own fold), a few bytes a node instead of kilobytes.
    `ignorable: false`: while the extender is away pods wait, rather than being bound
    by kube-scheduler alone to GPUs gpuloom does not know are taken."""
    lines = [
        "extenders:",
        f"- urlPrefix: {json.dumps(extender_url)}",
        f"  filterVerb: {json.dumps(filter_verb)}",
        f"  prioritizeVerb: {json.dumps(prioritize_verb)}",
        f"  bindVerb: {json.dumps(bind_verb)}",
        f"  weight: {int(weight)}",
        f"  nodeCacheCapable: {json.dumps(node_cache_capable)}",
        f"  ignorable: {json.dumps(ignorable)}",
        f"  httpTimeout: {json.dumps(http_timeout)}",
    ]
    if managed_resources:
        lines.append("  managedResources:")
        for name in managed_resources:
            lines += [f"  - name: {json.dumps(name)}", "    ignoredByScheduler: true"]
    return "\n".join(lines) + "\n"


def kube_banner(kubeconfig: str, port: int) -> str:
    """What `make run` with GPULOOM_KUBECONFIG says a newcomer pastes into kube-scheduler's
    configuration: the extender on loopback `port`, and its `extenders:` stanza."""
    url = f"http://127.0.0.1:{port}/scheduler"
    stanza = scheduler_config_stanza(url)
    indented = "\n".join(f"  {line}" for line in stanza.rstrip().splitlines())
    return KUBE_BANNER.format(kubeconfig=kubeconfig, url=url, stanza=indented)


KUBE_BANNER = """
Kubernetes: gpuloom schedules the GPUs of the cluster in {kubeconfig}
  extender  {url}/filter|prioritize|bind   (loopback only: run kube-scheduler on this host)
  watcher   its Nodes with gpuloom.io/gpu capacity are gpuloom's nodes (no simulated nodes:
            REST jobs need gpuloom's own agents; here, pods are the jobs)
Add this to kube-scheduler's KubeSchedulerConfiguration (docs/kubernetes.md has the whole
file, for v1beta1 and v1), then ask for `gpuloom.io/gpu: 1` in a pod's limits:
{stanza}
"""
