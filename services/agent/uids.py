"""A uid of its own for each gpuloom user, from a configured range (`agent_job_uid_range`).

A root agent runs each user's jobs under a uid of that user's own (docs/operations.md,
"Who jobs run as"), so that the kernel keeps users apart: another user's job cannot
read a job's `/proc/<pid>/environ`, signal it, or open its files. Where the user has
a local account of the same name and `agent_map_users` is on, that account wins
(`identity`); every other user gets a uid from the range.

The choice is deterministic but collision-safe: a user's first choice is the range's
slot at `sha256(user)`, so two agents on the same host that do not share a file
still agree on it; a slot that is taken (by another gpuloom user in the file, or by a
local account or group of the passwd and group databases, or root) is skipped for
the next one. Once chosen, a uid is the user's for good: it is kept in a small file
in the agent's state folder (`uids.json` in the run dir, mode 0600, replaced
atomically, changed under an exclusive `flock` so that agents sharing the run dir
never give one uid to two users). A uid that a local account later takes is given
up (logged) and the user gets a new one.

The job's gid is the uid itself (a group of the user's own); it has no other groups.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import hashlib
import json
import logging
import os
import pwd
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

log = logging.getLogger(__name__)

#: The default range of uids (and gids) for gpuloom users without a local account.
DEFAULT_UID_RANGE = range(200_000, 300_000)
#: The file in the agent's state folder that keeps each user's uid.
UIDS_FILE = "uids.json"


class UidError(Exception):
    """No uid can be given to a user (a bad range, or every uid in it taken)."""


def parse_uid_range(text: str) -> range:
    """`200000-299999` -> range(200000, 300000); refuses root and empty ranges."""
    first, _, last = text.partition("-")
    try:
        span = range(int(first), int(last) + 1)
    except ValueError as exc:
        raise UidError(f"not a uid range FIRST-LAST: {text!r}") from exc
    if len(span) == 0 or span.start <= 0 or span.stop > 2**32 - 1:
        raise UidError(f"uid range {text!r}: FIRST must be over 0 and at most LAST")
    return span


def is_local_id(uid: int) -> bool:
    """Whether a local account has `uid`, or a local group has it as its gid."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
        except KeyError:
            continue
        return True
    return False


def first_choice(user: str, span: range) -> int:
    """The index in `span` where `user`'s search starts (the same on every host)."""
    digest = hashlib.sha256(user.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % len(span)


def allocate(
    user: str, taken: Mapping[str, int], span: range, is_local: Callable[[int], bool]
) -> int:
    """The uid of `user`: the one it holds in `taken`, else the first free slot from its
    `first_choice` on (never 0, never one in `taken`, never a local account's)."""
    if user in taken:
        return taken[user]
    used = set(taken.values())
    start = first_choice(user, span)
    for step in range(len(span)):
        uid = span[(start + step) % len(span)]
        if uid != 0 and uid not in used and not is_local(uid):
            return uid
    raise UidError(f"no free uid left for {user!r} in {span.start}-{span.stop - 1}")


def cleaned(
    found: Mapping[str, object], span: range, is_local: Callable[[int], bool]
) -> dict[str, int]:
    """The entries of a read file that still hold: an int in `span`, not root, not a
    local account's, not one another user holds (the first by name keeps it)."""
    kept: dict[str, int] = {}
    for user in sorted(found):
        uid = found[user]
        if not isinstance(uid, int) or uid == 0 or uid not in span:
            log.warning("uid file: %r -> %r is not a uid of the range: dropped", user, uid)
        elif uid in kept.values() or is_local(uid):
            log.warning(
                "uid file: %r -> %d is taken (a local account, or twice): dropped", user, uid
            )
        else:
            kept[user] = uid
    return kept


class UidMap:
    """Each gpuloom user's uid, kept in `path` (see the module doc)."""

    def __init__(
        self,
        path: Path,
        span: range = DEFAULT_UID_RANGE,
        is_local: Callable[[int], bool] = is_local_id,
    ) -> None:
        self.path = path
        self.span = span
        self.is_local = is_local
        self._known: dict[str, int] = {}

    def uid(self, user: str) -> int:
        """`user`'s uid; the first time, read the file under its lock and add it there."""
        known = self._known.get(user)
        if known is not None:
            return known
        with self._locked():
            found = cleaned(self._read(), self.span, self.is_local)
            uid = allocate(user, found, self.span, self.is_local)
            if found.get(user) != uid:
                found[user] = uid
                self._write(found)
                log.info("user %r runs jobs as uid %d", user, uid)
        self._known = found
        return uid

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _read(self) -> dict[str, object]:
        try:
            found = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise UidError(f"{self.path}: unreadable ({exc}): fix or remove it") from exc
        if not isinstance(found, dict):
            raise UidError(f"{self.path}: not a JSON object: fix or remove it")
        return found

    def _write(self, users: Mapping[str, int]) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(json.dumps(dict(sorted(users.items())), indent=0).encode())
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.path)
