"""Who asked travels in the envelope: `principal` is written when known, absent (not
null) otherwise, and an envelope without it (older, or another writer's) reads as None."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson

from gpuloom.events import AccountCoordinatorsSet, AccountCreated, decode, encode, make_envelope
from gpuloom.testing.builders import LogBuilder


def test_the_principal_is_kept_when_known_and_absent_otherwise() -> None:
    event = AccountCoordinatorsSet(account="team", coordinators=["dave", "carol", "dave"])
    plain = make_envelope(event, at=datetime.now(UTC), by="gateway")
    assert "principal" not in orjson.loads(encode(plain))
    assert decode(1, encode(plain)).envelope.principal is None
    named = plain.model_copy(update={"principal": "ops"})
    assert orjson.loads(encode(named))["principal"] == "ops"
    recorded = decode(2, encode(named))
    assert recorded.envelope.principal == "ops"
    assert recorded.event == AccountCoordinatorsSet(account="team", coordinators=["carol", "dave"])


def test_coordinators_are_folded_onto_an_existing_account_only() -> None:
    log = LogBuilder()
    log.append(AccountCoordinatorsSet(account="ghost", coordinators=["dave"]))
    assert "ghost" not in log.state().accounts
    assert log.state().voided == 1
    log.append(AccountCreated(account="team"))
    log.append(AccountCoordinatorsSet(account="team", coordinators=["erin", "dave"]))
    assert log.state().accounts["team"].coordinators == ("dave", "erin")
