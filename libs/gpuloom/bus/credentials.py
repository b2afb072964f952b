"""How this process proves who it is to NATS: its nkey seed and TLS, from `Settings`.

Every NATS connection of gpuloom passes `connect_options(settings)` to
`EventBus.connect`: the seed file (`GPULOOM_NATS_SEED_FILE`) signs the server's
challenge, the inbox prefix follows from the seed's public key (each identity may
subscribe to its own inbox only, `gpuloom.bus.identities`), and TLS files, when set,
verify the server and present this client's certificate. No seed: the connection
carries whatever the URL holds (`nats://user:password@...`, or nothing).
"""

from __future__ import annotations

import logging
import ssl
import stat
from pathlib import Path
from typing import Any

from gpuloom.bus.identities import inbox_prefix
from gpuloom.bus.keyring import public_key_of
from gpuloom.config import Settings

log = logging.getLogger(__name__)


class CredentialsError(ValueError):
    """A seed or TLS file that cannot be used (missing, unreadable, not a seed)."""


def seed_options(seed_file: Path) -> dict[str, Any]:
    """Options that connect as the identity of `seed_file`; a seed readable by others
    than its owner is used, with a warning (it is a password)."""
    try:
        mode = seed_file.stat().st_mode
        public_key = public_key_of(seed_file.read_bytes())
    except OSError as exc:
        raise CredentialsError(f"NATS seed file {seed_file}: {exc}") from exc
    except Exception as exc:  # nkeys raises its own errors on a file that is not a seed
        raise CredentialsError(f"NATS seed file {seed_file} holds no nkey seed: {exc}") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("NATS seed file %s is readable by others: chmod 600 it", seed_file)
    return {"nkeys_seed": str(seed_file), "inbox_prefix": inbox_prefix(public_key)}


def tls_context(settings: Settings) -> ssl.SSLContext | None:
    """A client TLS context from the settings' CA, certificate and key; None when unset."""
    ca, cert, key = (
        settings.nats_tls_ca_file,
        settings.nats_tls_cert_file,
        settings.nats_tls_key_file,
    )
    if ca is None and cert is None:
        return None
    if (cert is None) != (key is None):
        raise CredentialsError("GPULOOM_NATS_TLS_CERT_FILE and _KEY_FILE go together")
    context = ssl.create_default_context(cafile=str(ca) if ca else None)
    if cert is not None and key is not None:
        context.load_cert_chain(str(cert), str(key))
    return context


def connect_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for `EventBus.connect` (and `nats.connect`) from `settings`."""
    options: dict[str, Any] = {}
    if settings.nats_seed_file is not None:
        options.update(seed_options(settings.nats_seed_file))
    context = tls_context(settings)
    if context is not None:
        options["tls"] = context
    return options
