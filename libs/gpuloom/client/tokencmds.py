"""`gpuloom token issue` (as Slurm's `scontrol token`): a bearer token signed with
the stack's own key, for a user, with roles, valid for a bounded time."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated

import typer

from gpuloom.auth import KNOWN_ROLES, issue_token, read_secret
from gpuloom.client.context import err, fail
from gpuloom.client.credentials import save_token
from gpuloom.config import load_settings

token_app = typer.Typer(help="Bearer tokens for the gateway.", no_args_is_help=True)

_DURATION = re.compile(r"^(\d+)([smhd]?)$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> int:
    """Seconds in `90`, `90s`, `30m`, `8h` or `7d`; ValueError otherwise."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a duration such as 3600, 30m, 8h or 7d")
    return int(match.group(1)) * _UNIT_S[match.group(2)]


@token_app.command("issue")
def issue(
    user: Annotated[str, typer.Option(help="Who the token names (its `sub`).")],
    role: Annotated[
        list[str] | None,
        typer.Option("--role", help=f"A role it grants (repeatable): {', '.join(KNOWN_ROLES)}."),
    ] = None,
    ttl: Annotated[str, typer.Option(help="How long it is valid: 3600, 30m, 8h, 7d.")] = "8h",
    save: Annotated[
        bool, typer.Option("--save", help="Also write it to the CLI's token file.")
    ] = False,
) -> None:
    """Sign a token with the stack's key (GPULOOM_AUTH_SECRET_FILE, else
    <data dir>/auth/jwt.key, made by the gateway's first start) and print it."""
    settings = load_settings()
    try:
        ttl_s = parse_duration(ttl)
    except ValueError as exc:
        fail(str(exc), 2)
    if not 0 < ttl_s <= settings.auth_max_ttl_s:
        fail(f"--ttl {ttl} is not within 1 s and the {settings.auth_max_ttl_s} s allowed", 2)
    path = settings.secret_file()
    if not path.exists():
        fail(
            f"no key at {path}: start the gateway once (it makes one) or set GPULOOM_AUTH_SECRET_FILE"
        )
    try:
        secret = read_secret(path)
        token = issue_token(
            secret,
            user,
            now=datetime.now(UTC),
            ttl_s=ttl_s,
            roles=role or [],
            user_claim=settings.auth_user_claim,
            roles_claim=settings.auth_roles_claim,
        )
    except (OSError, ValueError) as exc:
        fail(str(exc), 2)
    typer.echo(token)
    if save:
        err.print(f"saved to {save_token(token)}")
