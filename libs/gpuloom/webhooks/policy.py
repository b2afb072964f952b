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
from gpuloom.auth.visibility import Owner, StreamFilter, visible
from gpuloom.events import Event
from gpuloom.state.tenancy import Webhook

#: The longest wait a receiver's `Retry-After` may ask for (longer: this long).
RETRY_AFTER_MAX_S = 24 * 3600.0
#: The most of an answer's body kept with its attempt.
RESPONSE_KEPT = 1000

Outcome = Literal["delivered", "retry", "gone"]
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def owner_of(hook: Webhook, at: datetime) -> Principal:
    """Who the webhook sees as at `at` (an event's time in the log): its owner, an
    operator only while the registering (or renewing) token had not expired."""
    operator = hook.operator and (hook.operator_until is None or at < hook.operator_until)
    return Principal(hook.owner, frozenset({OPERATOR}) if operator else frozenset())


def gets(
    hook: Webhook,
    seq: int,
    event: Event,
    job_owner: Owner | None,
    accounts: Accounts,
    at: datetime,
) -> bool:
    """Whether the event at `seq`, stored in the log at `at`, goes to `hook`: written
    after it was registered, while it delivers, passing its filter, and one its owner
    may see (`owner_of`; account membership as it is now)."""
    if seq <= hook.registered_seq or hook.disabled is not None:
        return False
    wanted = StreamFilter(frozenset(hook.types), hook.job, hook.user, hook.account, hook.node)
    return wanted.wants(event, job_owner) and visible(
        owner_of(hook, at), event, job_owner, accounts
    )


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


#: IPv6 ranges whose addresses carry an IPv4 address (RFC 4291, 6052, 8215, 3056, 4380,
#: 2765): the address reaches, through some translator or tunnel, an IPv4 host that the
#: IPv4 rule would have to judge. They are refused outright, whatever the embedded
#: address and whatever `allow_private` says: a receiver has a plain address of its own.
#: IPv4-mapped addresses (::ffff:0:0/96) are not among them: a socket that connects to
#: one connects to the IPv4 address itself, so that address is judged instead.
EMBEDS_IPV4: tuple[tuple[ipaddress.IPv6Network, str], ...] = tuple(
    (ipaddress.IPv6Network(net), name)
    for net, name in (
        ("::/96", "IPv4-compatible (deprecated)"),
        ("::ffff:0:0:0/96", "IPv4-translated (SIIT)"),
        ("64:ff9b::/96", "NAT64 (well-known prefix)"),
        ("64:ff9b:1::/48", "NAT64 (local-use prefix)"),
        ("2002::/16", "6to4"),
        ("2001::/32", "Teredo"),
    )
)


def embedded_ipv4_form(address: Address) -> str | None:
    """The name of the IPv4-embedding form `address` has, or None (`EMBEDS_IPV4`;
    `::` and `::1`, inside ::/96, are the IPv6 unspecified and loopback addresses)."""
    if not isinstance(address, ipaddress.IPv6Address) or int(address) in (0, 1):
        return None
    for network, name in EMBEDS_IPV4:
        if address in network:
            return name
    return None


def address_problem(address: Address, allow_private: bool) -> str | None:
    """Why a delivery must not go to `address`, or None.

    Only public addresses by default: a webhook is a way to make gpuloom send
    requests, and it must not reach the cluster's own network (NATS, the database, the
    node agents, a cloud's metadata service at 169.254.169.254). An operator may allow
    the others (a receiver inside the cluster; the test stack), never an unspecified or
    multicast one, nor an IPv6 address that embeds an IPv4 one (`EMBEDS_IPV4`)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address_problem(address.ipv4_mapped, allow_private)
    form = embedded_ipv4_form(address)
    if form is not None:
        return (
            f"{address} is an IPv6 address that embeds an IPv4 one ({form}); "
            "such addresses are never delivered to: give the receiver a plain address"
        )
    if address.is_unspecified or address.is_multicast:
        return f"{address} is not an address one can deliver to"
    if address.is_global or allow_private:
        return None
    return (
        f"{address} is not a public address (loopback, private, link-local or reserved); "
        "an operator may allow such receivers with GPULOOM_WEBHOOK_ALLOW_PRIVATE=true"
    )


def redacted(url: str) -> str:
    """What of `url` may be logged: its scheme, host and port; never the path or the
    query, which may carry a receiver's secret."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "<not a URL>"
    host = parts.hostname or "?"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


def backlog_problem(
    pending: int, failing_since: datetime | None, now: datetime, limit: int, grace_s: float
) -> str | None:
    """Why a webhook's backlog disables it, or None.

    A backlog alone never does: a burst of events (one user's 10,000-task array) to a
    receiver that answers is delivered at the receiver's pace. It disables a webhook
    when it is over `limit` *and* the receiver is failing: it has failed every attempt
    since `failing_since` (none succeeded since), at least `grace_s` ago."""
    if pending <= limit or failing_since is None:
        return None
    failing_s = (now - failing_since).total_seconds()
    if failing_s < grace_s:
        return None
    return (
        f"{pending} deliveries waiting (more than {limit}) and the receiver has failed "
        f"every attempt for {int(failing_s)} s"
    )
