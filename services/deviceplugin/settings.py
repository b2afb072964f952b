"""The device plugin's settings, from its environment (a DaemonSet's pod spec)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_SPLIT = 10


class SettingsError(ValueError):
    """An environment variable the plugin cannot use."""


@dataclass(frozen=True)
class PluginSettings:
    #: The kubelet's device-plugin directory: kubelet.sock and the plugin's socket.
    directory: Path = DEFAULT_DIR
    #: The Kubernetes node this plugin serves (NODE_NAME, from the downward API).
    node: str = ""
    #: Simulated GPUs to advertise instead of discovering the real ones (None: discover).
    declared_gpus: int | None = None
    #: Device IDs advertised per GPU.
    split: int = DEFAULT_SPLIT
    #: How often kubelet.sock is looked at (a kubelet restart makes a new one).
    watch_s: float = 1.0
    #: How often the GPUs' health is asked of NVML.
    health_s: float = 30.0
    #: Whether to write the GPUs' UUIDs and the split on the Node (the extender reads them).
    annotate_node: bool = True
    log_level: str = "INFO"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> PluginSettings:
        node = environ.get("NODE_NAME", "").strip() or socket.gethostname()
        return cls(
            directory=Path(environ.get("GPULOOM_DEVICE_PLUGIN_DIR") or DEFAULT_DIR),
            node=node,
            declared_gpus=_optional_int(environ, "GPULOOM_DEVICE_PLUGIN_GPUS", least=0),
            split=_optional_int(environ, "GPULOOM_DEVICE_SPLIT", least=1) or DEFAULT_SPLIT,
            watch_s=_seconds(environ, "GPULOOM_DEVICE_PLUGIN_WATCH_S", 1.0),
            health_s=_seconds(environ, "GPULOOM_DEVICE_PLUGIN_HEALTH_S", 30.0),
            annotate_node=environ.get("GPULOOM_DEVICE_PLUGIN_ANNOTATE_NODE", "true").lower()
            not in ("0", "false", "no"),
            log_level=environ.get("GPULOOM_LOG_LEVEL", "INFO"),
        )


def _optional_int(environ: Mapping[str, str], name: str, least: int) -> int | None:
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    if not raw.isascii() or not raw.isdigit() or int(raw) < least:
        raise SettingsError(f"{name} must be a whole number of at least {least}, not {raw!r}")
    return int(raw)


def _seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name} must be a number of seconds, not {raw!r}") from None
    if not value > 0:
        raise SettingsError(f"{name} must be more than 0, not {raw!r}")
    return value
