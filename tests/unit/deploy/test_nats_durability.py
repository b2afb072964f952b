"""What a host crash can lose is declared wherever a nats-server is started: `make run`
(the config devstack writes), compose, and the Kubernetes manifests."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuloom.devstack import DEFAULT_NATS_SYNC, NATS_MAX_PAYLOAD, nats_config

ROOT = Path(__file__).resolve().parents[3]


def test_make_run_fsyncs_every_second_by_default() -> None:
    assert DEFAULT_NATS_SYNC == "1s"
    config = nats_config(Path("/data/nats"), 4250, 8222, DEFAULT_NATS_SYNC)
    assert 'sync_interval: "1s"' in config
    assert f"max_payload: {NATS_MAX_PAYLOAD}" in config
    assert 'store_dir: "/data/nats"' in config


def test_strict_mode_fsyncs_every_write() -> None:
    assert "sync_interval: always\n" in nats_config(Path("/d"), 1, 2, "always")


@pytest.mark.parametrize("bad", ["", "never", "0s", "1 s", "1s\n}\nx: {", "5"])
def test_a_sync_interval_that_is_not_a_duration_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="sync interval"):
        nats_config(Path("/d"), 1, 2, bad)


def test_compose_declares_the_sync_interval_and_max_payload() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    nats = compose["services"]["nats"]
    [mounted] = nats["configs"]
    assert mounted["target"] in nats["command"]
    content = compose["configs"][mounted["source"]]["content"]
    assert "sync_interval: ${GPULOOM_NATS_SYNC:-1s}" in content
    assert f"max_payload: {NATS_MAX_PAYLOAD}" in content


def test_kubernetes_fsyncs_every_write() -> None:
    config = next(
        doc
        for doc in yaml.safe_load_all((ROOT / "deploy" / "nats.yaml").read_text())
        if doc and doc["kind"] == "ConfigMap"
    )["data"]["nats.conf"]
    assert "sync_interval: always" in config
    assert f"max_payload: {NATS_MAX_PAYLOAD}" in config
