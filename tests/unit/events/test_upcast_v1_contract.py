"""v1 events the old, looser contract accepted still decode after issue #9 narrowed it:
their facts are kept, each value made the closest one the v2 contract holds."""

from __future__ import annotations

import orjson

from gpuloom.events import (
    AccountCreated,
    AccountUsersSet,
    JobSubmitted,
    NodeCordoned,
    NodeRegistered,
    decode,
)


def v1(event_type: str, data: dict[str, object]) -> bytes:
    return orjson.dumps(
        {
            "id": "e1",
            "type": event_type,
            "v": 1,
            "at": "2026-01-01T00:00:00+00:00",
            "by": "gateway",
            "data": data,
        }
    )


def test_a_v1_job_the_old_contract_took_is_kept_within_the_new_one() -> None:
    spec = {
        "name": "train\nnight",
        "user": "John Doe",
        "account": "ml.team",
        "command": ["sh", "-c", "echo a\u0000b"],
        "gpus": 1,
        "gpu_model": ["A100 80GB"],
        "time_limit_s": 300_000_000_000,
        "env": {"TOKEN": "x\u0000y", "A=B": "1"},
        "node_selector": {"zone name": "eu\u0007"},
        "depends_on": [{"job": "old.job"}],
    }
    data = {"job_id": "j1", "spec": spec, "idempotency_key": "key with spaces"}
    event = decode(1, v1("JobSubmitted", data)).event
    assert isinstance(event, JobSubmitted)
    got = event.spec
    assert (got.name, got.user, got.account) == ("train?night", "John_Doe", "ml-team")
    assert got.command == ["sh", "-c", "echo ab"]
    assert got.gpu_model == ["A100_80GB"]
    assert got.time_limit_s == 2**31 - 1
    assert got.env == {"TOKEN": "xy", "A_B": "1"}
    assert got.node_selector == {"zone_name": "eu?"}
    assert got.depends_on[0].job == "old-job"
    assert event.idempotency_key == "key_with_spaces"


def test_v1_nodes_accounts_and_cordons_decode() -> None:
    gpu = {"index": 0, "uuid": "GPU 1", "model": "Tesla V100", "memory_mib": 2**40}
    node = decode(1, v1("NodeRegistered", {"node": "n1", "spec": {"gpus": [gpu]}})).event
    assert isinstance(node, NodeRegistered)
    assert node.spec.gpus[0].model == "Tesla_V100" and node.spec.gpus[0].memory_mib == 2**31 - 1
    account = decode(2, v1("AccountCreated", {"account": "a", "description": "x\ty"})).event
    assert isinstance(account, AccountCreated) and account.description == "x?y"
    users = decode(3, v1("AccountUsersSet", {"account": "a", "users": ["Jane Roe"]})).event
    assert isinstance(users, AccountUsersSet) and users.users == ["Jane_Roe"]
    cordon = decode(4, v1("NodeCordoned", {"node": "n1", "reason": "disk\nfull"})).event
    assert isinstance(cordon, NodeCordoned) and cordon.reason == "disk?full"
