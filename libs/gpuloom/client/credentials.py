"""Which bearer token the CLI sends: `GPULOOM_TOKEN`, else the token file.

The token file is `$XDG_CONFIG_HOME/gpuloom/token` (by default
`~/.config/gpuloom/token`); `gpuloom token issue --save` writes it, mode 0600.
No token at all: requests go without one, and the gateway answers 401 unless its
authentication is off.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

TOKEN_ENV = "GPULOOM_TOKEN"


def token_path(env: Mapping[str, str] | None = None) -> Path:
    """Where the CLI keeps its token."""
    env = os.environ if env is None else env
    config = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(config) / "gpuloom" / "token"


def resolve_token(env: Mapping[str, str] | None = None) -> str | None:
    """The token to send: `GPULOOM_TOKEN`, else the token file's, else None."""
    env = os.environ if env is None else env
    given = env.get(TOKEN_ENV, "").strip()
    if given:
        return given
    path = token_path(env)
    try:
        saved = path.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return saved or None


def save_token(token: str, env: Mapping[str, str] | None = None) -> Path:
    """Write `token` to the token file (0600, its folder 0700); returns the path."""
    path = token_path(env)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    path.chmod(0o600)
    return path
