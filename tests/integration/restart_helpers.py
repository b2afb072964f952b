"""What the restart, snapshot and log-drop tests share: run jobs to the end, and wait
for a line in a service's log."""

from __future__ import annotations

import re
import time
from pathlib import Path

from gpuloom.testing.cluster import Cluster


def run_jobs(cluster: Cluster, count: int, tag: str) -> None:
    """Submit `count` one-GPU jobs named `<tag>-<i>` and check they all succeed."""
    ids = [
        cluster.submit(name=f"{tag}-{i}", gpus=1, command=["sh", "-c", "true"])
        for i in range(count)
    ]
    done = cluster.wait_final(ids, timeout=90)
    assert {job["state"] for job in done.values()} == {"succeeded"}, done


def wait_log(path: Path, pattern: str, timeout: float = 30) -> re.Match[str]:
    """The first match of `pattern` in the log at `path`, once it is written."""
    deadline = time.monotonic() + timeout
    while (found := re.search(pattern, path.read_text(errors="replace"))) is None:
        assert time.monotonic() < deadline, f"{path.name} never said /{pattern}/"
        time.sleep(0.2)
    return found
