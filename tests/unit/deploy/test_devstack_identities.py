"""`make run` gives every process its own identity on the bus, and the operator a token."""

from __future__ import annotations

import stat
from pathlib import Path

import jwt
import pytest

from gpuloom.auth import OPERATOR, read_secret
from gpuloom.bus.keyring import Keyring
from gpuloom.devstack import BANNER, SERVICES, Stack, inventory_nodes, operator_token
from gpuloom.natsserver import NatsServer, nats_config, strip_credentials

ROOT = Path(__file__).resolve().parents[3]


def test_each_process_gets_its_own_seed_and_an_agent_only_with_its_nodes(tmp_path: Path) -> None:
    keyring = Keyring(tmp_path / "bus")
    keyring.add_agent("agent-node-a", ["node-a"])
    server = NatsServer(tmp_path / "nats", keyring=keyring)  # not started: no reload needed
    stack = Stack.for_urls(server.admin_url, "sqlite://", tmp_path, server=server)
    assert "admin" not in stack.env["GPULOOM_NATS_URL"], "no process needs the admin's password"
    seeds = {
        name: stack.identity_env(name, name, None)["GPULOOM_NATS_SEED_FILE"] for name in SERVICES
    }
    assert len(set(seeds.values())) == len(SERVICES)
    assert all(Path(seed).name == f"{name}.seed" for name, seed in seeds.items())
    agent = stack.identity_env("agent-node-a", "agent", ["node-a"])
    assert agent["GPULOOM_NATS_SEED_FILE"].endswith("agent-node-a.seed")
    with pytest.raises(ValueError, match="nodes"):
        stack.identity_env("agent-x", "agent", None)
    with pytest.raises(ValueError, match="no identity"):
        stack.identity_env("tool", "somethingelse", None)


def test_without_identities_a_stack_passes_the_url_on(tmp_path: Path) -> None:
    stack = Stack.for_urls("nats://127.0.0.1:1", "sqlite://", tmp_path)
    assert stack.identity_env("gateway", "gateway", None) == {}
    assert stack.env["GPULOOM_NATS_URL"] == "nats://127.0.0.1:1"


def test_the_config_includes_the_users_beside_it() -> None:
    config = nats_config(Path("/d/nats"), 1, 2, "1s", Path("/d/nats.users.conf"), Path("/d/p"))
    assert 'include "nats.users.conf"' in config and 'pid_file: "/d/p"' in config
    assert strip_credentials("nats://admin:pw@127.0.0.1:4250") == "nats://127.0.0.1:4250"


def test_the_dev_inventories_name_their_nodes() -> None:
    assert inventory_nodes(ROOT / "deploy" / "inventory" / "node-a.yaml") == ["node-a"]


def test_the_banner_carries_an_operator_token(tmp_path: Path) -> None:
    token = operator_token(tmp_path)
    secret_file = tmp_path / "auth" / "jwt.key"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    claims = jwt.decode(
        token, read_secret(secret_file), algorithms=["HS256"], options={"verify_aud": False}
    )
    assert claims["sub"] == "admin" and OPERATOR in claims["roles"]
    assert claims["exp"] - claims["iat"] == 8 * 3600
    text = BANNER.format(url="http://x", nats="nats://y", data="/d", sync="1s", token=token)
    assert f"export GPULOOM_TOKEN={token}" in text
    assert "export GPULOOM_GATEWAY_URL=http://x" in text  # another port needs it in every shell
    assert "Authorization: Bearer $GPULOOM_TOKEN" in text
    assert "gpuloom token issue --user NAME" in text
