"""Composition root of the device plugin: `python -m services.deviceplugin`.

Environment (a DaemonSet's pod spec):

- `NODE_NAME`: the Kubernetes node (`fieldRef: spec.nodeName`); default the host name;
- `GPULOOM_DEVICE_PLUGIN_DIR`: the kubelet's device-plugin directory
  (default `/var/lib/kubelet/device-plugins`);
- `GPULOOM_DEVICE_PLUGIN_GPUS`: a number of simulated GPUs to advertise instead of
  the real ones (NVML, else nvidia-smi);
- `GPULOOM_DEVICE_SPLIT`: device IDs per GPU (default 10);
- `GPULOOM_KUBECONFIG` (or `KUBECONFIG`): a kubeconfig; default the pod's service
  account;
- `GPULOOM_DEVICE_PLUGIN_WATCH_S`, `GPULOOM_DEVICE_PLUGIN_HEALTH_S`: how often
  kubelet.sock and the GPUs' health are looked at (1 s, 30 s);
- `GPULOOM_DEVICE_PLUGIN_ANNOTATE_NODE=false`: do not write the GPUs' UUIDs and the
  split on the Node;
- `GPULOOM_LOG_LEVEL`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from gpuloom.kubeapi import KubeConfigError
from gpuloom.telemetry.logging import setup_logging
from services.deviceplugin.devices import discover_gpus
from services.deviceplugin.kube import kube_client
from services.deviceplugin.plugin import run_plugin
from services.deviceplugin.settings import PluginSettings, SettingsError

log = logging.getLogger("services.deviceplugin")


async def main(settings: PluginSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    gpus = await asyncio.to_thread(discover_gpus, settings.node, settings.declared_gpus)
    log.info(
        "node %s: %d GPUs (%s), %d device IDs each",
        settings.node,
        len(gpus),
        "simulated" if settings.declared_gpus is not None else "discovered",
        settings.split,
    )
    async with kube_client() as kube:
        await run_plugin(settings, kube, gpus, stop)
    log.info("device plugin stopped")


def entrypoint(argv: list[str] | None = None) -> None:
    try:
        settings = PluginSettings.from_env()
    except SettingsError as exc:
        sys.exit(f"gpuloom device plugin: {exc}")
    setup_logging("deviceplugin", settings.log_level)
    if not os.environ.get("NODE_NAME"):
        log.warning("NODE_NAME is not set: taking the host name %r as the node", settings.node)
    try:
        asyncio.run(main(settings))
    except KubeConfigError as exc:
        sys.exit(f"gpuloom device plugin: {exc}")


if __name__ == "__main__":
    entrypoint()
