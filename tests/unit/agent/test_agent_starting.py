"""How a process job starts as its account: setpriv and a shell script when it can,
launch.py otherwise; either way exactly the job's argv and environment, as the job's
account, in its working directory."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_agent_runner import JOB_USER, Harness, ensure

from services.agent.identity import Account
from services.agent.shim import SHIM_ENV, RunDir
from services.agent.starting import SETPRIV, process_start, quoted, scripted, start_script

text = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=30)


@settings(max_examples=60, deadline=None)
@given(words=st.lists(text, min_size=0, max_size=5), value=text)
def test_the_shell_gets_every_word_and_value_exactly(words: list[str], value: str) -> None:
    show = "import os, sys; print(repr((sys.argv[1:], os.environ['V'], sorted(os.environ))))"
    script = start_script([sys.executable, "-c", show, *words], {"V": value, "W": "w"})
    done = subprocess.run(  # as the shim runs it: SHIM_ENV alone
        ["/bin/sh", "-s"], input=os.fsencode(script), capture_output=True, env=SHIM_ENV
    )
    assert done.returncode == 0, done.stderr
    argv, seen, names = ast.literal_eval(done.stdout.decode())
    assert (argv, seen) == (words, value)
    assert set(names) <= {"V", "W", "LC_CTYPE"}  # Python may set LC_CTYPE itself


@pytest.fixture
def harness(run_root: Path) -> Harness:
    return Harness(run_root)


def test_what_a_script_cannot_start_goes_to_launch_py() -> None:
    assert scripted(["python", "-c", "x"], {"PATH": "/bin", "NCCL_DEBUG": "INFO"})
    assert not scripted(["python"], {"my-var": "1"})  # `export my-var` is no shell name
    assert not scripted(["-weird"], {})  # the shell's exec would read it as an option
    assert quoted("it's") == "'it'\\''s'"


def test_root_is_refused(tmp_path: Path) -> None:
    run = RunDir(tmp_path, "node-a", "j", 1)
    run.create()
    with pytest.raises(ValueError, match="root"):
        process_start(run, ["true"], {}, Account("root", 0, 0))


@pytest.mark.skipif(SETPRIV is None, reason="util-linux's setpriv is not installed")
async def test_both_ways_give_the_job_exactly_its_environment(harness: Harness) -> None:
    env = {"LR": "0.1", "QUOTE": 'it\'s "x" $HOME `id`\nline 2'}
    show = ["/usr/bin/env"]
    harness.start(ensure("scripted", show, env=env))
    harness.start(ensure("launched", show, env={**env, "my-var": "1"}))
    await harness.ended("scripted")
    await harness.ended("launched")
    scripted_env = env_of(harness.output("scripted"))
    launched_env = env_of(harness.output("launched"))
    assert scripted_env["QUOTE"] == env["QUOTE"].replace("\n", " ")
    assert launched_env.pop("my-var") == "1"
    assert launched_env == scripted_env  # the same both ways, but each job's own ids
    assert not RunDir(harness.runner.root, "node-a", "scripted", 1).file("launch").exists()
    assert not {"PWD", "OLDPWD", "SECRET"} & set(scripted_env)  # nothing of sh's or the agent's


def env_of(output: str) -> dict[str, str]:
    """`env`'s output as a dict, with the values that name the job left out."""
    found = dict(
        entry.split("=", 1) for entry in output.replace("\nline 2", " line 2").splitlines()
    )
    for name in ("HOME", "GPULOOM_JOB_ID"):
        found.pop(name)
    return found


@pytest.mark.skipif(os.geteuid() != 0 or SETPRIV is None, reason="needs root and setpriv")
async def test_the_scripted_job_runs_as_its_account_in_its_folder(harness: Harness) -> None:
    probe = ["sh", "-c", "id -u; id -g; pwd; echo to-stderr > /dev/stderr; trap"]
    harness.start(ensure("who", probe))
    assert (await harness.ended("who")).ended.outcome == "succeeded"
    work = RunDir(harness.runner.root, "node-a", "who", 1).work
    assert harness.output("who").splitlines() == [
        str(JOB_USER.pw_uid), str(JOB_USER.pw_gid), str(work),
    ]  # fmt: skip
    assert harness.output("who", "stderr") == "to-stderr\n"
    assert RunDir(harness.runner.root, "node-a", "who", 1).file("stdout").stat().st_uid == (
        JOB_USER.pw_uid
    )
