"""Intent keys are part of the log's contract: a decision re-made after an upgrade must
get the key the old version gave it, or JetStream would keep both. So each key's exact
form is pinned here, and no module outside `gpuloom.events.intents` spells one."""

from __future__ import annotations

import ast
from pathlib import Path

from gpuloom.events import intents

ROOT = Path(__file__).resolve().parents[3]


def test_each_key_keeps_its_form() -> None:
    assert intents.submitted("k-1") == "submit:k-1"
    assert intents.answered("j1", "admission") == "j1:admission"
    assert intents.answered_tasks("a1", "queued", 40, 977) == "a1:queued:40:977"
    assert intents.cancel_requested("j1") == "j1:cancel-request"
    assert intents.cancelled("j1") == "j1:cancelled"
    assert intents.queue_policy(12) == "queue-policy:12"
    assert intents.placed("j1", 2, 345) == "j1:placed:2:345"
    assert intents.preempted("j1", 2) == "j1:preempted:2"
    assert intents.reserved("j1", 345) == "j1:reserved:345"
    assert intents.started("j1", 1) == "j1:started:1"
    assert intents.started("j1", 1, 3) == "j1:started:1:r3"
    assert intents.finished("j1", 1) == "j1:finished:1"
    assert intents.finished("j1", 1, 3) == "j1:finished:1:r3"
    assert intents.charged("j1", 1, 0, interim=False) == "j1:charged:1"
    assert intents.charged("j1", 1, 2, interim=True) == "j1:charged-interim:1:p2"
    assert intents.node_registered("n1", 5) == "n1:registered:5"
    assert intents.node_recovered("n1", 5) == "n1:recovered:5"
    assert intents.node_lost("n1", 5) == "n1:lost:5"
    assert intents.webhook_disabled("w1") == "w1:disabled"
    assert intents.dead_letter("queue", 9) == "queue:9"


#: Calls that take an intent key, and the position of the key among their arguments.
KEYED = {"Decision": 1, "publish": 2}


def _keys_by_hand(tree: ast.AST) -> list[int]:
    """Lines where a key is spelt by hand: an f-string as a `Decision`'s key (its second
    argument, or `msg_id=`), as the gateway's `publish` key (its third), or as the value
    of a `Nats-Msg-Id` header."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in KEYED:
            at = KEYED[getattr(node.func, "id", "")]
            keys = node.args[at : at + 1] + [k.value for k in node.keywords if k.arg == "msg_id"]
            lines += [key.lineno for key in keys if isinstance(key, ast.JoinedStr)]
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                named = isinstance(key, ast.Constant) and key.value == "Nats-Msg-Id"
                if named and isinstance(value, ast.JoinedStr):
                    lines.append(value.lineno)
    return lines


def test_no_other_module_spells_an_intent_key() -> None:
    """A key made by hand elsewhere would escape the pins above."""
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for folder in ("libs", "services")
        for path in (ROOT / folder).rglob("*.py")
        for line in _keys_by_hand(ast.parse(path.read_text()))
    ]
    assert found == []


def test_the_check_finds_a_key_spelt_by_hand() -> None:
    spelt = ast.parse(
        'Decision(event, f"{job}:placed:{seq}")\nheaders = {"Nats-Msg-Id": f"{hook}:x"}\n'
        'await publish(gateway, event, f"{job}:cancel-request")'
    )
    assert _keys_by_hand(spelt) == [1, 2, 3]
