"""Child processes of the node-side test harness (containerd, the kubelet:
`gpuloom.testing.kubelet`): each in a session of its own, stopped by pid, and what they
leave on the host (mounts, cgroups, files) removed."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from gpuloom.natsserver import die_with_parent

CGROUP_ROOT = Path("/sys/fs/cgroup")

LOG_TAIL_LINES = 40


class NodeError(RuntimeError):
    """containerd or the kubelet did not start, or did not become ready."""


class ChildProcess:
    """One child process in a session of its own, its output in `log_path`."""

    name = "child"

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = Path(base_dir)
        self.log_path = self.base_dir / f"{self.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _spawn(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')} {' '.join(args)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                args,
                cwd=self.base_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(),
                env=env,
            )

    def _wait(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise NodeError(
                    f"{self.name} exited with {self.proc.returncode} while starting; "
                    f"the end of {self.log_path}:\n{self.log_tail()}"
                )
            try:
                if check():
                    return
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise NodeError(
                    f"{self.name}: not {what} within {timeout}s (last: {last or 'no'}); "
                    f"the end of {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def _terminate(self, grace_s: float) -> None:
        proc, self.proc = self.proc, None
        terminate(proc, grace_s)


def terminate(proc: subprocess.Popen[bytes] | None, grace_s: float) -> None:
    """SIGTERM `proc`, SIGKILL it after `grace_s`; nothing when it already ended."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def host_processes() -> Iterable[tuple[int, list[str]]]:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        yield int(entry.name), [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def mounts_under(base: Path) -> list[Path]:
    """Mount points at or under `base`, deepest first."""
    base = base.resolve()
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = Path(line.split()[4].encode().decode("unicode_escape"))
        if point == base or point.is_relative_to(base):
            found.append(point)
    return sorted(set(found), key=lambda p: len(p.parts), reverse=True)


def unmount_under(base: Path) -> None:
    for point in mounts_under(base):
        subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def cgroup_dirs(name: str) -> list[Path]:
    if not CGROUP_ROOT.is_dir():
        return []
    return [
        hierarchy / name
        for hierarchy in sorted(CGROUP_ROOT.iterdir())
        if hierarchy.is_dir() and not hierarchy.is_symlink()
    ]


def remove_empty_dirs(path: Path) -> None:
    """rmdir `path` and the directories under it, deepest first, those that are empty."""
    if not path.is_dir():
        return
    dirs = [Path(root) for root, _, _ in os.walk(path)]
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            d.rmdir()


def remove_cgroup_tree(path: Path) -> None:
    """rmdir a cgroup and its children, deepest first (a cgroup's files cannot be removed)."""
    if not path.is_dir():
        return
    dirs = [Path(root) for root, _, _ in os.walk(path)]
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            d.rmdir()
