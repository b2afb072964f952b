"""The launch file: what the agent writes is what `launch.py` reads, and `launch.py`
stays cheap to start (it runs once per job)."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from services.agent.launch import Launch, decode, encode
from services.agent.shim import LAUNCHER

words = st.binary(max_size=40).filter(lambda w: b"\0" not in w)
names = st.binary(min_size=1, max_size=20).filter(lambda w: b"\0" not in w and b"=" not in w)


@given(
    argv=st.lists(words, min_size=1, max_size=6),
    env=st.dictionaries(names, words, max_size=6),
    uid=st.integers(0, 2**32 - 1),
    groups=st.lists(st.integers(0, 2**32 - 1), max_size=4),
    cwd=words,
)
def test_a_launch_file_reads_back_as_written(
    argv: list[bytes], env: dict[bytes, bytes], uid: int, groups: list[int], cwd: bytes
) -> None:
    read = decode(encode(Launch(argv, env, uid, uid + 1, groups, cwd)))
    assert (read.argv, read.env, read.uid, read.gid, read.groups, read.cwd) == (
        argv, env, uid, uid + 1, groups, cwd,
    )  # fmt: skip


def test_anything_else_is_refused() -> None:
    for data in (b"", b"{}", b"gpuloom-launch-1\x001\x001\x00\x00/\x001\x005\x00true"):
        try:
            decode(data)
        except ValueError:
            continue
        raise AssertionError(f"decoded {data!r}")


def test_launch_py_imports_nothing_python_does_not_load_at_start() -> None:
    """Beyond os, errno and _signal: json (re, enum) or signal (enum) would double the
    CPU of every job's start."""
    probe = (
        "import sys, os, errno, _signal, __future__; before = set(sys.modules); "
        f"source = open({LAUNCHER!r}).read().split('if __name__')[0]; "
        "exec(compile(source, 'launch.py', 'exec'), {'__name__': 'probe'}); "
        "print(sorted(set(sys.modules) - before))"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", probe], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout
