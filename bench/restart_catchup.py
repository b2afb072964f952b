"""How long each service takes to be ready after a start on a long log, and its RSS.

Writes a long valid log (bench/longlog.py: 100 nodes x 8 GPUs, finished jobs of seven
events each at 10,000 jobs a day, then `--live` live jobs, 800 running and the rest
queued) straight onto a fresh nats-server's stream, then starts each real service
process on it, one at a time (`python -m services.<name>`, SQLite in a temp folder,
no auth). For each it measures:
  first start  from spawn until it has caught up with the log: the line
               "<service> caught up at seq N" of a scheduling service, the first 200 of
               the gateway's GET /readyz (its default lag allowance, 1,000 events);
               its RSS then (VmRSS) and its peak so far (VmHWM);
  restart      the same after a clean stop (SIGTERM writes a snapshot), with the
               sequence of the snapshot it started from ("starts from its snapshot at
               seq S").
A service that logs "replaying the log from seq S+1 up to seq S" (nothing to replay)
and no "caught up" within 2 s is counted ready at that line, with a note. Each line
also says how many events the service published meanwhile (its decisions).
Every service runs with GPULOOM_NODE_LOST_TIMEOUT_S=86400: no agent sends heartbeats,
and inventory must not declare the nodes lost while it is measured.

nats-server stamps each message when it stores it, and the fold bounds an event's
`at` to within MAX_CLOCK_SKEW (5 min) of that stamp. A log written in minutes with two
weeks of `at` would be bounded (and dead-lettered) event by event, so with `--clock
history` (default) the services run with that bound widened to a century (one
comparison per event, the cost is the same) and the log's clock is the two weeks the
events say: the 7-day retention of finished jobs applies. `--clock now` stamps every
event with the time it is written instead and runs the services unchanged; nothing
then expires (the whole log is within 7 days).

`--compare-ref REF` also measures the first start of each service with the code of git
ref REF (exported with `git archive`, run with this venv) against the same log.

  python bench/restart_catchup.py [--events 1001100] [--live 1000] [--clock history|now]
                                  [--services admission,queue,...] [--compare-ref a39b914]
                                  [--timeout 600] [--keep]   (keep: the temp folder, logs)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from longlog import LongLog, finished_jobs, validate, write

from gpuloom.bus import EventBus
from gpuloom.bus.jsapi import bucket_of
from gpuloom.bus.provision import provision_at
from gpuloom.devstack import REPO_ROOT, NatsServer, die_with_parent, free_port

SERVICES = ("admission", "queue", "placement", "inventory", "accounting", "gateway")
CAUGHT_UP = re.compile(r"caught up at seq (\d+)")
FROM_SNAPSHOT = re.compile(r"from its snapshot at seq (\d+)")
REPLAYING = re.compile(r"replaying the log from seq (\d+) up to seq (\d+)")
#: How long a service with nothing to replay is given to say it has caught up.
NOTHING_TO_REPLAY_GRACE_S = 2.0
#: Run a service with the fold's clock-skew bound widened (see the docstring).
WIDENED = (
    "import datetime, importlib, runpy, sys; "
    "fold = importlib.import_module('gpuloom.state.fold'); "
    "fold.MAX_CLOCK_SKEW = datetime.timedelta(days=36500); "
    "runpy.run_module('services.' + sys.argv[1], run_name='__main__', alter_sys=True)"
)


@dataclass
class Start:
    """One start of one service: how long until ready, its memory then, how it stopped."""

    seconds: float | None
    rss_mib: float
    peak_mib: float
    seq: int | None
    snapshot_seq: int | None
    stop_s: float
    note: str = ""


@dataclass
class Code:
    """Where the services' code is: this tree, or an exported ref."""

    root: Path
    widen: bool

    def command(self, name: str) -> list[str]:
        if self.widen:
            return [sys.executable, "-c", WIDENED, name]
        return [sys.executable, "-m", f"services.{name}"]

    def env(self, base: dict[str, str]) -> dict[str, str]:
        path = os.pathsep.join([str(self.root), str(self.root / "libs")])
        return {**base, "PYTHONPATH": path}


def memory_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of `pid` in MiB, from /proc (Linux)."""
    found = {"VmRSS": 0.0, "VmHWM": 0.0}
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:  # it has just ended
        lines = []
    for line in lines:
        key, _, value = line.partition(":")
        if key in found:
            found[key] = int(value.split()[0]) / 1024
    return found["VmRSS"], found["VmHWM"]


def readyz(port: int) -> int | None:
    """written_seq when the gateway's /readyz answers 200, else None."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return int(json.load(response)["written_seq"]) if response.status == 200 else None
    except OSError:
        return None


_idle: dict[tuple[Path, int], float] = {}


def caught_up(log: Path, offset: int, elapsed: float) -> tuple[int | None, float | None]:
    """(seq it caught up at, or None; when it said it had nothing to replay, or None)."""
    with open(log, "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    found = CAUGHT_UP.search(text)
    if found:
        return int(found.group(1)), None
    replaying = REPLAYING.search(text)
    if replaying and int(replaying.group(1)) > int(replaying.group(2)):
        return None, _idle.setdefault((log, offset), elapsed)
    return None, None


def measure(name: str, code: Code, env: dict[str, str], log: Path, timeout: float) -> Start:
    """Start `name`, wait until it is ready (or `timeout`), read its memory, SIGTERM it."""
    offset = log.stat().st_size if log.exists() else 0
    port = int(env["GPULOOM_GATEWAY_PORT"])
    started = time.perf_counter()
    with open(log, "ab") as out:
        process = subprocess.Popen(
            code.command(name),
            env=code.env(env),
            cwd=code.root,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
    seconds, seq, note = None, None, ""
    while seconds is None:
        elapsed = time.perf_counter() - started
        if process.poll() is not None:
            note = f"exited with {process.returncode} before it was ready"
            break
        if elapsed > timeout:
            note = f"not ready after {timeout:.0f} s"
            break
        if name == "gateway":
            seq = readyz(port)
        else:
            seq, idle_since = caught_up(log, offset, elapsed)
            idle = idle_since is not None and elapsed - idle_since >= NOTHING_TO_REPLAY_GRACE_S
            if seq is None and idle:
                seconds, seq = idle_since, -1
                note = "nothing to replay and never said 'caught up' (time: the replay line)"
                break
        if seq is not None:
            seconds = elapsed
        else:
            time.sleep(0.25 if name == "gateway" else 0.05)
    rss, peak = memory_mib(process.pid)
    stop_started = time.perf_counter()
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            note += " (killed: no clean stop within 60 s)"
    stop_s = time.perf_counter() - stop_started
    with open(log, "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    worries = ("voided seq", "bounded the time", "skips snapshot", "cannot read", "Traceback")
    for worry in worries:
        if worry in text:
            note += f" [{text.count(worry)} x {worry!r} in its log]"
    snap = FROM_SNAPSHOT.search(text)
    snapshot_seq = int(snap.group(1)) if snap else None
    return Start(seconds, rss, peak, seq, snapshot_seq, stop_s, note.strip())


def exported(ref: str, into: Path) -> Path:
    """The tree of git ref `ref`, exported under `into` (nothing changes in the repo)."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", ref], cwd=REPO_ROOT, check=True, capture_output=True
    ).stdout
    into.mkdir(parents=True)
    tar_path = into.with_suffix(".tar")
    tar_path.write_bytes(archive)
    with tarfile.open(tar_path) as tar:
        tar.extractall(into, filter="data")
    tar_path.unlink()
    return into


def migrate(code: Code, env: dict[str, str]) -> None:
    subprocess.run(
        [sys.executable, "-m", "gpuloom.store.migrate"],
        env=code.env(env),
        cwd=code.root,
        check=True,
        capture_output=True,
    )


def fmt(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def row(start: Start) -> list[str]:
    return [fmt(start.seconds), fmt(start.rss_mib, 0), fmt(start.peak_mib, 0)]


def print_table(results: dict[str, tuple[Start, Start]]) -> None:
    print(
        "\n| service | first start (full replay) s | RSS MiB | peak MiB "
        "| restart from snapshot s | RSS MiB | peak MiB | snapshot seq |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, (first, again) in results.items():
        snap = f"{again.snapshot_seq:,}" if again.snapshot_seq is not None else "none"
        print(f"| {name} | {' | '.join(row(first) + row(again))} | {snap} |")
    for name, (first, again) in results.items():
        for label, start in (("first start", first), ("restart", again)):
            if start.note:
                print(f"  {name} {label}: {start.note}")


async def write_log(url: str, args: argparse.Namespace) -> tuple[int, float]:
    bus = await EventBus.connect(url, "GPULOOM", name="bench-writer", dedup_window_s=7200)
    try:
        started = time.perf_counter()
        last = await write(
            bus, LongLog(finished_jobs(args.events), args.live, time.time()), args.clock
        )
        return last, time.perf_counter() - started
    finally:
        await bus.close()


async def forget_snapshots(url: str, service: str) -> None:
    """Empty `service`'s snapshot bucket: a first start with other code must replay the
    log, not restore the snapshot this tree's run left (the bucket stays, empty)."""
    bus = await EventBus.connect(url, "GPULOOM", name="bench-forget", create=False)
    try:
        await bus.js.purge_stream(f"OBJ_{bucket_of(service)}")
    finally:
        await bus.close()


async def last_seq(url: str) -> int:
    bus = await EventBus.connect(url, "GPULOOM", name="bench-reader", create=False)
    try:
        return await bus.last_seq()
    finally:
        await bus.close()


def run(args: argparse.Namespace) -> None:
    state = validate(2000, args.live)
    print(f"generated log checked on a sample: {state.applied} applied, {state.voided} voided")
    workdir = Path(tempfile.mkdtemp(prefix="gpuloom-restart-"))
    nats = NatsServer(workdir / "nats").start()
    try:
        jobs = finished_jobs(args.events)
        print(
            f"writing {jobs:,} finished jobs + {args.live:,} live ({args.clock} clock) ...",
            flush=True,
        )
        last, took = asyncio.run(write_log(nats.url, args))
        print(f"wrote {last:,} events in {took:.1f} s ({last / took:,.0f} events/s)", flush=True)
        asyncio.run(provision_at(nats.url, "GPULOOM"))  # the buckets, as `gpuloom bus setup`
        print(f"load before the starts: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores")
        here = Code(REPO_ROOT, widen=args.clock == "history")
        results: dict[str, tuple[Start, Start]] = {}
        logs = workdir / "logs"
        logs.mkdir()
        base = service_env(nats.url, workdir / "here")
        migrate(here, base)
        for name in args.services:
            before = asyncio.run(last_seq(nats.url))
            first = measure(name, here, base, logs / f"{name}.log", args.timeout)
            again = measure(name, here, base, logs / f"{name}.log", args.timeout)
            results[name] = (first, again)
            added = asyncio.run(last_seq(nats.url)) - before
            print(
                f"{name}: first start {fmt(first.seconds)} s, {fmt(first.rss_mib, 0)} MiB; "
                f"restart {fmt(again.seconds)} s, {fmt(again.rss_mib, 0)} MiB, "
                f"from snapshot seq {again.snapshot_seq}; stops {first.stop_s:.1f}/{again.stop_s:.1f} s; "
                f"it published {added} events",
                flush=True,
            )
        print_table(results)
        if args.compare_ref:
            compare(args, nats.url, workdir, results)
        print(f"load after: {os.getloadavg()[0]:.2f} (1 min); service logs in {logs}")
    finally:
        nats.stop()
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)


def service_env(nats_url: str, data_dir: Path) -> dict[str, str]:
    data_dir.mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "GPULOOM_NATS_URL": nats_url,
        "GPULOOM_DATABASE_URL": f"sqlite+aiosqlite:///{data_dir}/db.sqlite",
        "GPULOOM_DATA_DIR": str(data_dir),
        "GPULOOM_AUTH": "off",
        "GPULOOM_GATEWAY_PORT": str(free_port()),
        "GPULOOM_NODE_LOST_TIMEOUT_S": "86400",
        "PYTHONUNBUFFERED": "1",
    }


def compare(
    args: argparse.Namespace, nats_url: str, workdir: Path, here: dict[str, tuple[Start, Start]]
) -> None:
    """The first start of each service with the code of `args.compare_ref`, same log."""
    ref = Code(exported(args.compare_ref, workdir / "ref"), widen=args.clock == "history")
    env = service_env(nats_url, workdir / "ref-data")
    probe = "import gpuloom, services; print(gpuloom.__file__, services.__file__)"
    found = subprocess.run(
        [sys.executable, "-c", probe], env=ref.env(env), cwd=ref.root, capture_output=True
    ).stdout.decode()
    if str(REPO_ROOT) in found or str(ref.root) not in found:
        raise RuntimeError(f"{args.compare_ref}: its code is not the one imported: {found}")
    migrate(ref, env)
    print(
        f"\nfirst start with {args.compare_ref} (the log now ends at seq {asyncio.run(last_seq(nats_url)):,}):"
    )
    print(
        f"| service | {args.compare_ref} s | RSS MiB | this tree s | RSS MiB | time ratio | RSS ratio |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in args.services:
        asyncio.run(forget_snapshots(nats_url, name))
        old = measure(name, ref, env, workdir / "logs" / f"{name}-ref.log", args.timeout)
        new = here[name][0]
        ratio = f"{old.seconds / new.seconds:.1f}x" if old.seconds and new.seconds else "—"
        mem = f"{old.rss_mib / new.rss_mib:.1f}x" if old.rss_mib and new.rss_mib else "—"
        cells = [fmt(old.seconds), fmt(old.rss_mib, 0), fmt(new.seconds), fmt(new.rss_mib, 0)]
        print(
            f"| {name} | {' | '.join(cells)} | {ratio} | {mem} |"
            + (f" {old.note}" if old.note else ""),
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_001_100)
    parser.add_argument("--live", type=int, default=1000)
    parser.add_argument("--clock", choices=["history", "now"], default="history")
    parser.add_argument("--services", type=lambda s: s.split(","), default=list(SERVICES))
    parser.add_argument("--timeout", type=float, default=600.0, help="per start, seconds")
    parser.add_argument("--compare-ref", default="")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (logs, store)")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
