"""Who is asking: bearer tokens (JWT) proven by the stack's key or an identity
provider's JWKS, and the principal they name. What a principal may do is
`gpuloom.auth.policy` (pure); the gateway only translates."""

from gpuloom.auth.tokens import (
    KNOWN_ROLES,
    OPERATOR,
    Principal,
    TokenError,
    TokenVerifier,
    ensure_secret,
    issue_token,
    read_secret,
)

__all__ = [
    "KNOWN_ROLES",
    "OPERATOR",
    "Principal",
    "TokenError",
    "TokenVerifier",
    "ensure_secret",
    "issue_token",
    "read_secret",
]
