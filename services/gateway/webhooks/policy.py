"""What a webhook gets, when a failed delivery is tried again, and where a delivery may
go: pure functions of their inputs (the clock is a parameter)."""

from __future__ import annotations

import ipaddress
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Literal
from urllib.parse import urlsplit

from gpuloom.auth import OPERATOR, Principal
from gpuloom.auth.policy import Accounts
from gpuloom.events import Event
from gpuloom.state.model import Webhook
from services.gateway.stream import Owner, StreamFilter, visible

#: The longest wait a receiver's `Retry-After` may ask for (longer: this long).
RETRY_AFTER_MAX_S = 24 * 3600.0
#: The most of an answer's body kept with its attempt.
RESPONSE_KEPT = 1000

Outcome = Literal["delivered", "retry", "gone"]
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def owner_of(hook: Webhook) -> Principal:
    """Who the webhook sees as: its owner, with the roles it had when registering it."""
    return Principal(hook.owner, frozenset({OPERATOR}) if hook.operator else frozenset())


def gets(
    hook: Webhook, seq: int, event: Event, job_owner: Owner | None, accounts: Accounts
) -> bool:
    """Whether the event at `seq` goes to `hook`: written after it was registered, while
    it delivers, passing its filter, and one its owner may see."""
    if seq <= hook.registered_seq or hook.disabled is not None:
        return False
    wanted = StreamFilter(frozenset(hook.types), hook.job, hook.user, hook.account, hook.node)
    return wanted.wants(event, job_owner) and visible(owner_of(hook), event, job_owner, accounts)


def outcome(status_code: int) -> Outcome:
    """2xx: delivered; 410 Gone: the receiver wants no more (the hook is disabled);
    anything else (and no answer at all): tried again."""
    if 200 <= status_code < 300:
        return "delivered"
    return "gone" if status_code == 410 else "retry"


def retry_after_s(value: str | None, now: datetime) -> float | None:
    """The seconds a `Retry-After` header asks for (delay-seconds or an HTTP date)."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), RETRY_AFTER_MAX_S)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return min(max(0.0, (when - now).total_seconds()), RETRY_AFTER_MAX_S)


def next_delay(
    attempts: int, schedule: tuple[float, ...], retry_after: float | None
) -> float | None:
    """Seconds until the next attempt after `attempts` failed ones; None: give up.

    The schedule says how many retries there are and how far apart; a receiver's
    `Retry-After` replaces the wait it asks about (it knows when it is back)."""
    if attempts > len(schedule):
        return None
    planned = schedule[attempts - 1]
    return planned if retry_after is None else retry_after


def url_problem(url: str) -> str | None:
    """What is wrong with a webhook URL, or None: http(s), a host, no credentials."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"not a URL: {exc}"
    if parts.scheme not in ("http", "https"):
        return "the scheme must be http or https"
    if not parts.hostname:
        return "the URL names no host"
    if parts.username is not None or parts.password is not None:
        return "credentials in the URL are refused (the receiver checks the signature)"
    if port == 0:
        return "port 0 cannot be reached"
    return None


def address_problem(address: Address, allow_private: bool) -> str | None:
    """Why a delivery must not go to `address`, or None.

    Only public addresses by default: a webhook is a way to make the gateway send
    requests, and it must not reach the cluster's own network (NATS, the database, the
    node agents, a cloud's metadata service at 169.254.169.254). An operator may allow
    the others (a receiver inside the cluster; the test stack), never an unspecified or
    multicast one."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address_problem(address.ipv4_mapped, allow_private)
    if address.is_unspecified or address.is_multicast:
        return f"{address} is not an address one can deliver to"
    if address.is_global or allow_private:
        return None
    return (
        f"{address} is not a public address (loopback, private, link-local or reserved); "
        "an operator may allow such receivers with GPULOOM_WEBHOOK_ALLOW_PRIVATE=true"
    )
