"""Background services lower their own priority (`gpuloom.runtime.priority`), in a
child process each: the nice value is the process's, for the rest of its life."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CHILD = """
import os, sys
from pathlib import Path
from gpuloom.runtime.priority import lower_priority
group = Path(sys.argv[3]) if len(sys.argv) > 3 else Path("/proc/self/autogroup")
said = lower_priority(sys.argv[1], int(sys.argv[2]), autogroup=group)
print(os.getpriority(os.PRIO_PROCESS, 0), said)
"""


def run(*args: str, session: bool = True) -> str:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *args],
        capture_output=True,
        text=True,
        check=True,
        start_new_session=session,
    )
    return done.stdout.strip()


def test_a_background_service_runs_at_the_nice_value_it_is_given(tmp_path: Path) -> None:
    group = tmp_path / "autogroup"
    out = run("accounting", "10", str(group))
    assert out.startswith("10 accounting runs behind"), out
    assert group.read_text() == "10" and "autogroup" in out


def test_the_services_that_answer_requests_keep_their_priority(tmp_path: Path) -> None:
    group = tmp_path / "autogroup"
    for service in ("gateway", "placement", "queue", "admission", "dispatch", "agent"):
        assert run(service, "10", str(group)) == "0 None"
    assert run("projector", "0", str(group)) == "0 None"  # 0: turned off
    assert not group.exists()


def test_a_process_that_shares_its_session_leaves_the_session_group_alone(
    tmp_path: Path,
) -> None:
    group = tmp_path / "autogroup"
    out = run("webhooks", "5", str(group), session=False)
    assert out.startswith("5 webhooks runs behind") and "autogroup" not in out
    assert not group.exists()


def test_on_this_kernel_the_session_group_is_lowered_too() -> None:
    if not Path("/proc/self/autogroup").exists():
        pytest.skip("a kernel without autogroups: the nice value alone orders processes")
    check = CHILD + "print(Path('/proc/self/autogroup').read_text().split()[-1])"
    done = subprocess.run(
        [sys.executable, "-c", check, "webhooks", "7"],
        capture_output=True,
        text=True,
        check=True,
        start_new_session=True,
    )
    assert done.stdout.split()[-1] == "7", done.stdout
