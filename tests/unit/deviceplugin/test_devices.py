"""The device plugin's devices, what it writes on its Node, and its settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.deviceplugin.devices import (
    Gpu,
    device_id,
    device_ids,
    node_annotations,
    simulated_gpus,
)
from services.deviceplugin.settings import PluginSettings, SettingsError


def test_each_gpu_is_split_into_device_ids() -> None:
    gpus = simulated_gpus("node-a", 2)

    assert [g.uuid for g in gpus] == ["GPU-sim-node-a-0", "GPU-sim-node-a-1"]
    assert device_ids(gpus, 3) == [
        ("GPU-sim-node-a-0::0", "GPU-sim-node-a-0"),
        ("GPU-sim-node-a-0::1", "GPU-sim-node-a-0"),
        ("GPU-sim-node-a-0::2", "GPU-sim-node-a-0"),
        ("GPU-sim-node-a-1::0", "GPU-sim-node-a-1"),
        ("GPU-sim-node-a-1::1", "GPU-sim-node-a-1"),
        ("GPU-sim-node-a-1::2", "GPU-sim-node-a-1"),
    ]


def test_a_device_id_stays_within_the_kubelet_limit() -> None:
    real = "GPU-5b1e8f4c-2a1f-4c07-9e1f-0c2c4f0e1a11"
    assert device_id(real, 9) == f"{real}::9"
    long = device_id("GPU-sim-" + "n" * 80 + "-0", 12)
    assert len(long) <= 63 and long.endswith("::12")
    assert long == device_id("GPU-sim-" + "n" * 80 + "-0", 12)  # stable


def test_what_the_node_is_told() -> None:
    gpus = [
        Gpu(1, "GPU-b", "NVIDIA H100 80GB HBM3", 81559),
        Gpu(0, "GPU-a", "NVIDIA H100 80GB HBM3", 81000),
    ]

    assert node_annotations(gpus, 10, simulated=False) == {
        "gpuloom.io/gpu-split": "10",
        "gpuloom.io/gpu-uuids": "GPU-a,GPU-b",
        "gpuloom.io/gpu-memory-mib": "81000",
        "gpuloom.io/model": "H100-80GB-HBM3",
    }
    assert node_annotations(simulated_gpus("n", 2), 4, simulated=True) == {
        "gpuloom.io/gpu-split": "4",
        "gpuloom.io/gpu-uuids": "GPU-sim-n-0,GPU-sim-n-1",
    }


def test_settings_from_the_environment() -> None:
    settings = PluginSettings.from_env(
        {
            "NODE_NAME": "gpu-node-1",
            "GPULOOM_DEVICE_PLUGIN_DIR": "/tmp/dp",
            "GPULOOM_DEVICE_PLUGIN_GPUS": "4",
            "GPULOOM_DEVICE_SPLIT": "5",
        }
    )

    assert (settings.node, settings.directory) == ("gpu-node-1", Path("/tmp/dp"))
    assert (settings.declared_gpus, settings.split) == (4, 5)
    defaults = PluginSettings.from_env({"NODE_NAME": "n"})
    assert defaults.directory == Path("/var/lib/kubelet/device-plugins")
    assert (defaults.declared_gpus, defaults.split) == (None, 10)
    with pytest.raises(SettingsError, match="GPULOOM_DEVICE_SPLIT"):
        PluginSettings.from_env({"GPULOOM_DEVICE_SPLIT": "0"})
