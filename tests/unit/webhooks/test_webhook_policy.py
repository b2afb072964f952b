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
from gpuloom.events.webhooks import (
    WebhookDeleted,
    WebhookDisabled,
    WebhookRegistered,
    WebhookRenewed,
)
from gpuloom.state import fold
from gpuloom.state.fold import apply
from gpuloom.webhooks.policy import (
    address_problem,
    backlog_problem,
    gets,
    next_delay,
    outcome,
    redacted,
    retry_after_s,
    url_problem,
)
from gpuloom.webhooks.sealing import Sealer, SealError
from gpuloom.webhooks.signing import SecretError, new_secret, secret_key, signature

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
    # one bit of the ciphertext flipped (replacing its last characters could leave the
    # bytes as they were: the last base64 character carries padding bits)
    raw = bytearray(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    raw[len(raw) // 2] ^= 1
    tampered = base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")
    assert tampered != body
    with pytest.raises(SealError):
        sealer.unseal(f"{version}.{nonce}.{tampered}", "wh1")


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


@pytest.mark.parametrize(
    ("address", "form"),
    [
        ("::10.0.0.1", "IPv4-compatible"),
        ("::8.8.8.8", "IPv4-compatible"),
        ("::ffff:0:10.0.0.1", "SIIT"),
        ("::ffff:0:8.8.8.8", "SIIT"),
        ("64:ff9b::10.0.0.1", "NAT64 (well-known"),
        ("64:ff9b::169.254.169.254", "NAT64 (well-known"),
        ("64:ff9b::8.8.8.8", "NAT64 (well-known"),
        ("64:ff9b:1::a00:1", "NAT64 (local-use"),
        ("64:ff9b:1:808:800::", "NAT64 (local-use"),
        ("2002:a00:1::1", "6to4"),  # 10.0.0.1
        ("2002:808:808::1", "6to4"),  # 8.8.8.8
        ("2001:0:4136:e378:8000:63bf:f5ff:fffe", "Teredo"),  # client 10.0.0.1
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),  # a public one
    ],
)
def test_ipv6_forms_that_embed_ipv4_are_refused_whatever_they_embed(
    address: str, form: str
) -> None:
    ip = ipaddress.ip_address(address)
    for allow_private in (False, True):
        problem = address_problem(ip, allow_private=allow_private)
        assert problem is not None and form in problem, problem


def test_ipv4_mapped_is_judged_as_its_ipv4_and_plain_ipv6_is_not_caught() -> None:
    mapped_public = ipaddress.ip_address("::ffff:8.8.8.8")
    assert address_problem(mapped_public, allow_private=False) is None
    assert address_problem(ipaddress.ip_address("::ffff:10.0.0.1"), allow_private=False)
    assert address_problem(ipaddress.ip_address("::1"), allow_private=True) is None  # loopback
    for public in ("2606:4700::1111", "2a00:1450:4001::200e", "2001:4860:4860::8888"):
        assert address_problem(ipaddress.ip_address(public), allow_private=False) is None


@pytest.mark.parametrize(
    ("url", "logged"),
    [
        ("https://hooks.example.org/T0/B1/s3cret?token=s3cret", "https://hooks.example.org"),
        ("http://10.0.0.5:8080/x/s3cret", "http://10.0.0.5:8080"),
        ("http://[::1]:9/s3cret", "http://[::1]:9"),
        ("http://example.org:99999/s3cret", "<not a URL>"),
    ],
)
def test_what_is_logged_of_a_url_is_its_host(url: str, logged: str) -> None:
    assert redacted(url) == logged


def test_a_backlog_disables_only_a_webhook_whose_receiver_fails() -> None:
    limit, grace = 100, 3600.0
    hour_ago = NOW - timedelta(hours=1, seconds=1)
    # a burst to a receiver that answers: the head delivery was never failed
    assert backlog_problem(10_000, None, NOW, limit, grace) is None
    # failing, but not for long (a receiver restarting)
    assert backlog_problem(10_000, NOW - timedelta(minutes=5), NOW, limit, grace) is None
    # failing for long, but little waits
    assert backlog_problem(limit, hour_ago, NOW, limit, grace) is None
    problem = backlog_problem(limit + 1, hour_ago, NOW, limit, grace)
    assert problem is not None and "101 deliveries waiting" in problem and "3601 s" in problem


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
    assert gets(hook, 6, finished, alices, {}, NOW)
    assert not gets(hook, 5, finished, alices, {}, NOW)  # written before it was registered
    assert not gets(hook, 6, finished, bobs, {}, NOW)  # not alice's to see
    assert not gets(
        hook, 6, NodeCordoned(node="n1", reason="x"), None, {}, NOW
    )  # not a type it asked
    anything = fold([recorded(registered(), seq=5, at=NOW)]).webhooks["wh1"]
    assert gets(anything, 6, NodeCordoned(node="n1", reason="x"), None, {}, NOW)
    assert not gets(anything, 7, WebhookDeleted(webhook_id="wh2"), None, {}, NOW)  # operators only
    state = fold(
        [
            recorded(registered(), seq=5, at=NOW),
            recorded(WebhookDisabled(webhook_id="wh1", reason="410"), seq=6, at=NOW),
            recorded(WebhookDisabled(webhook_id="wh1", reason="later"), seq=7, at=NOW),
        ]
    )
    assert state.webhooks["wh1"].disabled == "410"
    assert not gets(state.webhooks["wh1"], 8, finished, alices, {}, NOW)
    gone = fold(
        [
            recorded(registered(), seq=5, at=NOW),
            recorded(WebhookDeleted(webhook_id="wh1"), seq=6, at=NOW + timedelta(seconds=1)),
        ]
    )
    assert gone.webhooks == {}


def test_operator_powers_end_when_the_registering_token_expires_until_renewed() -> None:
    expires = NOW + timedelta(hours=1)
    bobs_job = JobFinished(job_id="j1", node="n1", attempt=1, exit_code=0, outcome="succeeded")
    bob, ops = ("bob", "research"), ("ops", "research")
    state = fold(
        [recorded(registered(owner="ops", operator=True, operator_until=expires), seq=5, at=NOW)]
    )
    hook = state.webhooks["wh1"]
    assert gets(hook, 6, bobs_job, bob, {}, NOW + timedelta(minutes=59))  # an operator's
    later = expires + timedelta(seconds=1)
    assert not gets(hook, 7, bobs_job, bob, {}, later)  # a plain user's now: not theirs
    assert gets(hook, 7, bobs_job, ops, {}, later)  # their own job's still
    assert gets(hook, 7, NodeCordoned(node="n1", reason="x"), None, {}, later)
    renewed = NOW + timedelta(hours=9)
    apply(
        state,
        recorded(
            WebhookRenewed(webhook_id="wh1", operator=True, operator_until=renewed),
            seq=8,
            at=later,
        ),
    )
    hook = state.webhooks["wh1"]
    assert (hook.operator, hook.operator_until) == (True, renewed)
    assert gets(hook, 9, bobs_job, bob, {}, later)
    assert not gets(hook, 9, bobs_job, bob, {}, renewed)
    forever = fold([recorded(registered(owner="ops", operator=True), seq=5, at=NOW)])
    assert gets(forever.webhooks["wh1"], 6, bobs_job, bob, {}, NOW + timedelta(days=999))
    apply(state, recorded(WebhookRenewed(webhook_id="nope", operator=True), seq=10, at=later))
    assert state.recent_voided[-1].seq == 10


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
