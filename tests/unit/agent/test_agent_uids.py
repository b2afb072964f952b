"""Each gpuloom user's own uid: never root, never shared, stable, never a local account's."""

from __future__ import annotations

import json
import pwd
import stat
from pathlib import Path

import pytest

from services.agent.uids import (
    UidError,
    UidMap,
    allocate,
    cleaned,
    first_choice,
    is_local_id,
    parse_uid_range,
)

SPAN = range(200_000, 300_000)


def no_locals(uid: int) -> bool:
    return False


def test_a_users_uid_is_its_first_choice_in_the_range_the_same_everywhere() -> None:
    uid = allocate("alice", {}, SPAN, no_locals)

    assert uid == SPAN[first_choice("alice", SPAN)]
    assert allocate("alice", {}, SPAN, no_locals) == uid  # another agent, no shared file
    assert allocate("alice", {"alice": 200_007}, SPAN, no_locals) == 200_007  # kept


def test_a_taken_uid_is_skipped_whether_another_user_or_a_local_account_has_it() -> None:
    wanted = allocate("alice", {}, SPAN, no_locals)

    assert allocate("alice", {"bob": wanted}, SPAN, no_locals) == wanted + 1
    assert allocate("alice", {}, SPAN, lambda uid: uid == wanted) == wanted + 1


@pytest.mark.parametrize("span", [range(0, 1), range(0, 2)], ids=["only root", "root and one more"])
def test_root_is_never_given(span: range) -> None:
    if len(span) == 1:
        with pytest.raises(UidError, match="no free uid"):
            allocate("alice", {}, span, no_locals)
    else:
        assert allocate("alice", {}, span, no_locals) == 1
        with pytest.raises(UidError):
            allocate("bob", {"alice": 1}, span, no_locals)


@pytest.mark.parametrize(
    ("text", "problem"),
    [("0-10", "over 0"), ("10-5", "at most"), ("a-b", "not a uid range")],
    ids=["root in the range", "empty", "not numbers"],
)
def test_a_bad_range_is_refused(text: str, problem: str) -> None:
    with pytest.raises(UidError, match=problem):
        parse_uid_range(text)


def test_uids_are_kept_private_and_stable_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "agent" / "uids.json"
    first = UidMap(path, SPAN, no_locals)
    users = [f"user{i}" for i in range(50)]
    uids = [first.uid(user) for user in users]

    again = UidMap(path, SPAN, no_locals)  # the agent restarted
    assert [again.uid(user) for user in reversed(users)] == list(reversed(uids))
    assert len(set(uids)) == len(users) and 0 not in uids
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == dict(zip(users, uids, strict=True))


def test_agents_sharing_the_file_never_give_one_uid_to_two_users(tmp_path: Path) -> None:
    path = tmp_path / "uids.json"
    tiny = range(500, 502)  # two uids: every user collides
    one, two = UidMap(path, tiny, no_locals), UidMap(path, tiny, no_locals)

    assert {one.uid("alice"), two.uid("bob")} == {500, 501}
    assert two.uid("alice") == one.uid("alice")
    with pytest.raises(UidError, match="no free uid"):
        one.uid("carol")


def test_a_uid_a_local_account_took_since_is_given_up(tmp_path: Path) -> None:
    path = tmp_path / "uids.json"
    path.write_text(json.dumps({"alice": 200_001, "bob": 200_001, "eve": 0}))

    assert cleaned(json.loads(path.read_text()), SPAN, no_locals) == {"alice": 200_001}
    fresh = UidMap(path, SPAN, lambda uid: uid == 200_001)
    assert fresh.uid("alice") not in (200_001, 0)


def test_a_real_local_accounts_uid_is_never_given() -> None:
    nobody = pwd.getpwnam("nobody").pw_uid
    span = range(nobody, nobody + 1000)

    assert is_local_id(nobody)
    assert allocate("x", {"y": nobody + 1}, span, is_local_id) not in (nobody, nobody + 1)
