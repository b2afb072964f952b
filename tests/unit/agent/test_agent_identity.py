"""Who jobs run as: accounts from the passwd database, never root."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from services.agent.identity import (
    Account,
    AccountError,
    Accounts,
    job_accounts,
    prepare_workdir,
    resolve_account,
)

NOBODY = pwd.getpwnam("nobody")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
not_root = pytest.mark.skipif(os.geteuid() == 0, reason="an agent that is not root")


def test_an_account_is_resolved_with_its_ids_and_groups() -> None:
    account = resolve_account("nobody")

    assert (account.name, account.uid, account.gid) == ("nobody", NOBODY.pw_uid, NOBODY.pw_gid)
    assert NOBODY.pw_gid in account.groups and 0 not in account.groups


@pytest.mark.parametrize(
    ("name", "problem"),
    [("root", "jobs never run as root"), ("no-such-user-gpuloom", "no local account")],
    ids=["root is refused", "a missing account is refused"],
)
def test_an_account_jobs_cannot_run_as_is_refused(name: str, problem: str) -> None:
    with pytest.raises(AccountError, match=problem):
        resolve_account(name)


@as_root
def test_a_root_agent_runs_each_users_jobs_as_their_own_uid_unless_one_user_is_configured(
    tmp_path: Path,
) -> None:
    accounts = job_accounts(uid_file=tmp_path / "uids.json")
    alice, bob = accounts.for_user("alice"), accounts.for_user("bob")

    assert alice.uid != bob.uid and 0 not in (alice.uid, bob.uid)
    assert (alice.name, alice.gid, alice.groups) == ("alice", alice.uid, ())
    assert "a uid of their user's own from 200000-299999" in accounts.describe()
    shared = job_accounts("nobody")
    assert shared.for_user("alice") == shared.for_user("bob") == resolve_account("nobody")
    assert "not isolated from each other" in shared.describe()


@as_root
def test_mapped_local_accounts_win_over_the_uid_range(tmp_path: Path) -> None:
    accounts = job_accounts(map_users=True, uid_file=tmp_path / "uids.json")

    assert accounts.for_user("nobody") == resolve_account("nobody")
    assert accounts.for_user("root").uid != 0  # root's name gets a uid of the range
    assert accounts.for_user("root").uid in range(200_000, 300_000)


@as_root
@pytest.mark.parametrize("user", ["root", "no-such-user-gpuloom"])
def test_a_root_agent_refuses_to_start_with_an_unusable_job_user(user: str) -> None:
    with pytest.raises(AccountError):
        job_accounts(user)


@as_root
def test_mapping_runs_a_job_as_its_users_account_where_one_exists_and_never_as_root() -> None:
    fallback = Account("fallback", 4242, 4242)
    accounts = Accounts(fallback, map_users=True)

    assert accounts.for_user("nobody") == resolve_account("nobody")
    assert accounts.for_user("no-such-user-gpuloom") == fallback
    assert accounts.for_user("root") == fallback
    assert Accounts(fallback).for_user("nobody") == fallback  # mapping is off by default


@not_root
def test_an_agent_that_is_not_root_runs_jobs_as_itself_and_says_so() -> None:
    accounts = job_accounts("nobody", map_users=True)

    assert accounts.for_user("nobody").uid == os.geteuid()
    assert "cannot switch" in accounts.describe() and "ignored" in accounts.describe()


def test_the_working_directory_is_the_accounts_own_and_private(tmp_path: Path) -> None:
    account = resolve_account("nobody") if os.geteuid() == 0 else Account("me", os.geteuid(), 0)
    work = tmp_path / "work"

    prepare_workdir(work, account)
    prepare_workdir(work, account)  # again (a spawn retried): fine

    info = work.stat()
    assert (info.st_uid, info.st_mode & 0o777) == (account.uid, 0o700)
