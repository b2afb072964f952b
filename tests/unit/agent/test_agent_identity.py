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
def test_a_root_agent_runs_jobs_as_nobody_unless_configured() -> None:
    assert job_accounts().for_user("alice") == resolve_account("nobody")
    assert "jobs run as nobody (uid 65534)" in job_accounts().describe()


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
