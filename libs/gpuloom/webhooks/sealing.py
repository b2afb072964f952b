"""Webhook secrets sealed for the log: AES-256-GCM under the stack's webhook key.

The log is read by outside readers (the `reader` identity, `GET /v1/events` for
operators); a webhook's signing secret must not be readable there. The key is a file
made on first start (`Settings.webhook_key`, mode 0600, like the token secret); the
gateway seals with it (registration) and the webhooks process opens with it (signing),
so every replica of both mounts the same one. A sealed secret is `v1.<nonce>.<ciphertext>`
(URL-safe base64), bound to its webhook's id (the associated data), so a sealed secret
copied into another registration does not open.
"""

from __future__ import annotations

import base64
import hashlib
import secrets

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gpuloom.auth import ensure_secret
from gpuloom.config import Settings

VERSION = "v1"


class SealError(ValueError):
    """A sealed secret this key cannot open (another key, another webhook, altered)."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Sealer:
    def __init__(self, key_material: bytes) -> None:
        # a fixed-size AES key from the file's random text, whatever its length
        self._aead = AESGCM(hashlib.sha256(b"gpuloom webhook secrets\x00" + key_material).digest())

    def seal(self, secret: str, webhook_id: str) -> str:
        nonce = secrets.token_bytes(12)
        sealed = self._aead.encrypt(nonce, secret.encode(), webhook_id.encode())
        return f"{VERSION}.{_b64(nonce)}.{_b64(sealed)}"

    def unseal(self, sealed: str, webhook_id: str) -> str:
        version, _, rest = sealed.partition(".")
        nonce, _, body = rest.partition(".")
        if version != VERSION or not nonce or not body:
            raise SealError(f"not a sealed secret of version {VERSION}")
        try:
            return self._aead.decrypt(_unb64(nonce), _unb64(body), webhook_id.encode()).decode()
        except (InvalidTag, ValueError) as exc:
            raise SealError(
                "the webhook key does not open this secret (another key, or altered)"
            ) from exc


def load_sealer(settings: Settings) -> Sealer:
    """The sealer of this stack's webhook key (made on first start)."""
    return Sealer(ensure_secret(settings.webhook_key()))
