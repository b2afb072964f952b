"""Standard Webhooks signatures (https://www.standardwebhooks.com, spec 1.0).

The signed content is `{webhook-id}.{webhook-timestamp}.{body}`; the signature is
HMAC-SHA256 under the secret's bytes (the base64 after `whsec_`), sent as
`webhook-signature: v1,<base64>`. A receiver checks it, and that the timestamp is
recent (docs/webhooks.md has one in a few lines).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

PREFIX = "whsec_"
#: The key sizes taken (bytes): the spec's 24 to 64, and what base64 groups round up to.
KEY_MIN, KEY_MAX = 24, 68
#: A secret, as the published schema says it (`SecretError` says why another is not).
SECRET_PATTERN = r"^whsec_(?:[A-Za-z0-9+/]{4}){8,22}(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


class SecretError(ValueError):
    """A secret that is not `whsec_` and the base64 of 24 to 64 bytes."""


def new_secret() -> str:
    """A fresh secret of 32 random bytes, in the spec's `whsec_` form."""
    return PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def secret_key(secret: str) -> bytes:
    """The key bytes of `secret`, or `SecretError` saying what is wrong."""
    if not secret.startswith(PREFIX):
        raise SecretError(f"a secret starts with {PREFIX!r} (Standard Webhooks)")
    try:
        key = base64.b64decode(secret[len(PREFIX) :], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SecretError(f"the part after {PREFIX!r} is not base64") from exc
    if not KEY_MIN <= len(key) <= KEY_MAX:
        raise SecretError(f"the key is {len(key)} bytes; {KEY_MIN} to {KEY_MAX} are allowed")
    return key


def signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header value of one attempt."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signed_headers(secret: str, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three headers of the spec for one attempt (the timestamp is the attempt's)."""
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(secret, message_id, timestamp, body),
    }
