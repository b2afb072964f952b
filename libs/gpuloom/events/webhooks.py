"""Events of webhooks: subscriptions that get the log's events POSTed to a URL.

A webhook is part of the log like everything users ask for, so that every gateway
replica, and a gateway rebuilt from nothing, knows the same subscriptions. Its signing
secret is in the log only sealed (`secret_sealed`: AES-GCM under the gateway's webhook
key, `gpuloom.webhooks.sealing`): the log is readable by outside readers, the
secret must not be.

The filter is the event stream's (`GET /v1/events`): types, job, user, account, node;
what the owner may see is decided with the owner's roles as they were when it was
registered (`operator`), and operator powers only until the registering token expired
(`operator_until`) or until the expiry of the token that renewed them
(WebhookRenewed); after it the webhook sees what its owner sees as a plain user.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, ClassVar

from pydantic import Field

from gpuloom.events.base import SUBJECT_TOKEN, Event
from gpuloom.events.text import VISIBLE_ASCII_PATTERN, Remark, UserName

#: The longest URL a webhook may have (what browsers and proxies commonly take).
URL_MAX = 2048
#: The most event types one filter may name.
TYPES_MAX = 100

Token = Annotated[str, Field(pattern=SUBJECT_TOKEN.pattern)]


class WebhookEvent(Event):
    """An event about one webhook."""

    AGGREGATE: ClassVar[str] = "webhook"
    webhook_id: str = Field(pattern=SUBJECT_TOKEN.pattern)

    def aggregate_id(self) -> str:
        return self.webhook_id


class WebhookRegistered(WebhookEvent):
    """`owner` registered a webhook: the events after this one that pass `types`, `job`,
    `user`, `account` and `node` (empty: any) and that the owner may see are POSTed to
    `url`, signed with the secret sealed in `secret_sealed` (Standard Webhooks)."""

    TYPE: ClassVar[str] = "WebhookRegistered"
    owner: UserName
    #: The owner was an operator when registering it (it sees every event),
    operator: bool = False
    #: until this time, when the registering token expired (its `exp`); None: no
    #: expiry (authentication off, or registered before gpuloom recorded it).
    operator_until: datetime | None = None
    url: str = Field(min_length=8, max_length=URL_MAX, pattern=VISIBLE_ASCII_PATTERN)
    types: list[Token] = Field(default_factory=list, max_length=TYPES_MAX)
    job: Token | None = None
    user: Token | None = None
    account: Token | None = None
    node: Token | None = None
    secret_sealed: str = Field(min_length=1, max_length=500, pattern=VISIBLE_ASCII_PATTERN)
    description: Remark = ""


class WebhookDeleted(WebhookEvent):
    """The owner or an operator deleted the webhook: nothing more is delivered."""

    TYPE: ClassVar[str] = "WebhookDeleted"


class WebhookDisabled(WebhookEvent):
    """The gateway stopped delivering to the webhook (its receiver answered 410 Gone,
    or its backlog grew too long); registering it again starts anew."""

    TYPE: ClassVar[str] = "WebhookDisabled"
    reason: Remark


class WebhookRenewed(WebhookEvent):
    """The owner renewed the webhook's powers with a fresh token: it sees as an
    operator (`operator`) until `operator_until`, the token's expiry."""

    TYPE: ClassVar[str] = "WebhookRenewed"
    operator: bool
    operator_until: datetime | None = None
