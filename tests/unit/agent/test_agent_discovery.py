"""Discovery of the real node: nvidia-smi output, model and host names."""

from __future__ import annotations

import pytest

from services.agent import discovery
from services.agent.discovery import (
    DiscoveryError,
    discover_local_node,
    normalise_model,
    parse_nvidia_smi,
    sanitise_node_name,
)

SAMPLE = """\
0, GPU-5b1e8f4c-2a1f-4c07-9e1f-0c2c4f0e1a11, NVIDIA H100 80GB HBM3, 81559
1, GPU-7d2e9a3b-3b2e-4d18-8f20-1d3d5e1f2b22, NVIDIA H100 80GB HBM3, 81559

"""


def test_nvidia_smi_csv_becomes_gpu_specs() -> None:
    gpus = parse_nvidia_smi(SAMPLE)

    assert [(g.index, g.uuid[:12], g.model, g.memory_mib) for g in gpus] == [
        (0, "GPU-5b1e8f4c", "H100-80GB-HBM3", 81559),
        (1, "GPU-7d2e9a3b", "H100-80GB-HBM3", 81559),
    ]


def test_nvidia_smi_oddities() -> None:
    gpus = parse_nvidia_smi("1, GPU-b, Tesla T4, [N/A]\n0, GPU-a, NVIDIA A100-SXM4-80GB, 81920\n")

    assert [(g.index, g.model, g.memory_mib) for g in gpus] == [
        (0, "A100-SXM4-80GB", 81920),
        (1, "Tesla-T4", 0),
    ]
    with pytest.raises(ValueError, match="expected 4 fields"):
        parse_nvidia_smi("0, GPU-a\n")


@pytest.mark.parametrize(
    ("raw", "name"),
    [("gpu01", "gpu01"), ("gpu01.example.com", "gpu01-example-com"), ("my host!", "my-host-")],
)
def test_hostnames_are_sanitised(raw: str, name: str) -> None:
    assert sanitise_node_name(raw) == name


def test_unusable_names_are_refused() -> None:
    with pytest.raises(DiscoveryError):
        sanitise_node_name("...")
    with pytest.raises(DiscoveryError, match="invalid node name"):
        discover_local_node("bad.name")


def test_model_names_drop_the_vendor() -> None:
    assert normalise_model(" NVIDIA GeForce RTX 4090 ") == "GeForce-RTX-4090"


def test_a_machine_without_gpu_is_refused_unless_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(discovery, "gpus_from_nvml", lambda: None)
    monkeypatch.setattr(discovery, "gpus_from_nvidia_smi", lambda: None)
    with pytest.raises(DiscoveryError, match=r"no GPU found.*--allow-no-gpu"):
        discover_local_node("here")
    assert discover_local_node("here", allow_no_gpu=True).spec.gpus == []


def test_this_machine_is_one_real_node() -> None:
    node = discover_local_node("here", allow_no_gpu=True)

    assert node.name == "here"
    assert not node.spec.simulated
    assert node.spec.cpu_milli >= 1000


def test_a_real_node_takes_its_place_in_the_topology_from_the_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(discovery, "gpus_from_nvml", lambda: None)
    monkeypatch.setattr(discovery, "gpus_from_nvidia_smi", lambda: None)
    node = discover_local_node("here", allow_no_gpu=True, topology="nvlink=nvl-3, rack=r12")
    assert [(p.level, p.domain) for p in node.spec.topology] == [
        ("nvlink", "nvl-3"),
        ("rack", "r12"),
    ]
    for bad in ("rack", "rack=r1,rack=r2", "rack=r 1"):
        with pytest.raises(DiscoveryError, match="GPULOOM_AGENT_TOPOLOGY"):
            discover_local_node("here", allow_no_gpu=True, topology=bad)
