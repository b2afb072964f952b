"""Webhooks' pure parts: signatures, sealed secrets, retries, addresses, what a webhook
gets, and the fold of their events."""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuloom.events import Event, JobFinished, NodeCordoned, Recorded, make_envelope
from gpuloom.events.webhooks import WebhookDeleted, WebhookDisabled, WebhookRegistered
from gpuloom.state import fold
from gpuloom.state.fold import apply
from services.gateway.webhooks.policy import (
    address_problem,
    gets,
    next_delay,
    outcome,
    retry_after_s,
    url_problem,
)
from services.gateway.webhooks.sealing import Sealer, SealError
from services.gateway.webhooks.signing import SecretError, new_secret, secret_key, signature

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def recorded(event: Event, *, seq: int, at: datetime) -> Recorded:
    return Recorded(seq, make_envelope(event, at=at, by="gateway"), event)


def test_the_signature_is_the_specs_hmac_of_id_timestamp_and_body() -> None:
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # the spec's example key
    body = b'{"test": 2432232314}'
    key = base64.b64decode(secret[len("whsec_") :])
    mac = hmac.new(key, b"msg_p5jXN8AQM9LWM0D4loKWxJek.1614265330." + body, hashlib.sha256)
    expected = "v1," + base64.b64encode(mac.digest()).decode()
    assert signature(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body) == expected
    assert expected == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="  # as the spec says


@pytest.mark.parametrize("secret", ["plain", "whsec_!!!", "whsec_" + "QUFB" * 2, ""])
def test_a_secret_not_in_the_specs_form_is_refused(secret: str) -> None:
    with pytest.raises(SecretError):
        secret_key(secret)
    assert len(secret_key(new_secret())) == 32


def test_a_sealed_secret_opens_only_with_its_key_and_webhook() -> None:
    sealer = Sealer(b"key one")
    sealed = sealer.seal("whsec_abc", "wh1")
    assert "whsec_abc" not in sealed and sealer.unseal(sealed, "wh1") == "whsec_abc"
    for other, hook in ((Sealer(b"key two"), "wh1"), (sealer, "wh2")):
        with pytest.raises(SealError):
            other.unseal(sealed, hook)
    version, nonce, body = sealed.split(".")
    with pytest.raises(SealError):
        sealer.unseal(f"{version}.{nonce}.{body[:-2]}AA", "wh1")


def test_outcomes_and_retries() -> None:
    assert [outcome(c) for c in (200, 204, 301, 410, 429, 500)] == [
        "delivered", "delivered", "retry", "gone", "retry", "retry",
    ]  # fmt: skip
    schedule = (5.0, 300.0)
    assert next_delay(1, schedule, None) == 5.0
    assert next_delay(2, schedule, 42.0) == 42.0  # Retry-After replaces the wait
    assert next_delay(3, schedule, None) is None  # retries spent
    assert retry_after_s("120", NOW) == 120.0
    assert retry_after_s("Fri, 04 Dec 2026 12:01:00 GMT", NOW) == 60.0
    assert retry_after_s("99999999", NOW) == 24 * 3600.0
    assert retry_after_s("soon", NOW) is None and retry_after_s(None, NOW) is None


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("https://ci.example.org/hook", None),
        ("http://10.0.0.5:8080/x?y=1", None),
        ("ftp://example.org/x", "scheme"),
        ("http:///x", "no host"),
        ("https://u:p@example.org/", "credentials"),
        ("http://example.org:0/", "port 0"),
        ("http://example.org:99999/", "not a URL"),
    ],
)
def test_urls(url: str, problem: str | None) -> None:
    found = url_problem(url)
    assert (found is None) if problem is None else (found is not None and problem in found)


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("93.184.216.34", True),
        ("2606:2800:220:1:248:1893:25c8:1946", True),
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),  # a cloud's metadata service
        ("100.64.0.1", False),  # carrier-grade NAT
        ("::1", False),
        ("fd00::1", False),
        ("::ffff:127.0.0.1", False),  # IPv4 mapped into IPv6
    ],
)
def test_only_public_addresses_unless_allowed(address: str, public: bool) -> None:
    ip = ipaddress.ip_address(address)
    assert (address_problem(ip, allow_private=False) is None) == public
    assert address_problem(ip, allow_private=True) is None
    for never in ("0.0.0.0", "224.0.0.1", "::"):
        assert address_problem(ipaddress.ip_address(never), allow_private=True) is not None


def registered(**fields: object) -> WebhookRegistered:
    base: dict[str, object] = {
        "webhook_id": "wh1", "owner": "alice", "url": "https://h.example/x",
        "secret_sealed": "v1.a.b",
    }  # fmt: skip
    return WebhookRegistered.model_validate(base | fields)


def test_the_fold_keeps_webhooks_and_what_they_get() -> None:
    state = fold([recorded(registered(types=["JobFinished"]), seq=5, at=NOW)])
    hook = state.webhooks["wh1"]
    assert (hook.registered_seq, hook.types, hook.disabled) == (5, ("JobFinished",), None)
    finished = JobFinished(job_id="j1", node="n1", attempt=1, exit_code=0, outcome="succeeded")
    alices, bobs = ("alice", "research"), ("bob", "research")
    assert gets(hook, 6, finished, alices, {})
    assert not gets(hook, 5, finished, alices, {})  # written before it was registered
    assert not gets(hook, 6, finished, bobs, {})  # not alice's to see
    assert not gets(hook, 6, NodeCordoned(node="n1", reason="x"), None, {})  # not a type it asked
    anything = fold([recorded(registered(), seq=5, at=NOW)]).webhooks["wh1"]
    assert gets(anything, 6, NodeCordoned(node="n1", reason="x"), None, {})
    assert not gets(anything, 7, WebhookDeleted(webhook_id="wh2"), None, {})  # operators only
    state = fold(
        [
            recorded(registered(), seq=5, at=NOW),
            recorded(WebhookDisabled(webhook_id="wh1", reason="410"), seq=6, at=NOW),
            recorded(WebhookDisabled(webhook_id="wh1", reason="later"), seq=7, at=NOW),
        ]
    )
    assert state.webhooks["wh1"].disabled == "410"
    assert not gets(state.webhooks["wh1"], 8, finished, alices, {})
    gone = fold(
        [
            recorded(registered(), seq=5, at=NOW),
            recorded(WebhookDeleted(webhook_id="wh1"), seq=6, at=NOW + timedelta(seconds=1)),
        ]
    )
    assert gone.webhooks == {}


def test_a_second_registration_or_an_unknown_webhook_is_void() -> None:
    state = fold([recorded(registered(), seq=1, at=NOW)])
    apply(state, recorded(registered(url="https://other.example/"), seq=2, at=NOW))
    apply(state, recorded(WebhookDeleted(webhook_id="nope"), seq=3, at=NOW))
    assert [v.seq for v in state.recent_voided] == [2, 3]
    assert state.webhooks["wh1"].url == "https://h.example/x"


@given(st.binary(max_size=200), st.text(min_size=1, max_size=30), st.integers(0, 2**40))
def test_any_change_to_the_body_breaks_the_signature(body: bytes, msg: str, ts: int) -> None:
    secret = new_secret()
    assert signature(secret, msg, ts, body) != signature(secret, msg, ts, body + b"x")
