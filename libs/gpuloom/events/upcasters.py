"""Upcasters turn a payload written at an older schema version into the current shape.

Each upcaster maps `(type, from_version)` to a function of the payload dict that
returns the payload at `from_version + 1`. Reading applies the chain until the
event class's VERSION is reached. Schema changes are additive or bump VERSION and
add an upcaster here, with a test: `gpuloom.events.contract` states the rules and
tests/unit/events/test_event_contract.py holds them against `contracts/events.json`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpuloom.events import sanitize

Payload = dict[str, Any]
Upcaster = Callable[[Payload], Payload]

#: v2 of these types narrowed their strings and integers to what storage, the bus and
#: `exec` hold; their v1 payloads are brought within it (`sanitize`).
UPCASTERS: dict[tuple[str, int], Upcaster] = {
    ("JobSubmitted", 1): sanitize.job_submitted,
    ("NodeRegistered", 1): sanitize.node_registered,
    ("AccountCreated", 1): sanitize.remark("description"),
    ("AccountUsersSet", 1): sanitize.account_users,
    ("NodeCordoned", 1): sanitize.remark("reason"),
    # v2 adds the scopes "default" and "cluster": every v1 payload is a v2 one as it is
    ("LimitsSet", 1): dict,
}


class UnknownVersionError(ValueError):
    """A payload is newer than this code, or an upcaster in the chain is missing."""


def upcast(
    event_type: str,
    version: int,
    payload: Payload,
    target_version: int,
    upcasters: Mapping[tuple[str, int], Upcaster] = UPCASTERS,
) -> Payload:
    """Apply the upcaster chain from `version` to `target_version`."""
    if version > target_version:
        raise UnknownVersionError(
            f"{event_type} v{version} is newer than this code (v{target_version})"
        )
    while version < target_version:
        step = upcasters.get((event_type, version))
        if step is None:
            raise UnknownVersionError(f"no upcaster for {event_type} v{version}")
        payload = step(payload)
        version += 1
    return payload
