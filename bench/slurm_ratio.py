"""gpuloom against Slurm, back to back in one run: jobs started per second, and the ratio.

This machine's speed varies about 2x from hour to hour, so the headline figure is a
ratio measured in one run, not an absolute rate. Each round runs:

* Slurm 22.05 from Debian, with the scripts of `../shared/anchors/slurm/` (16 slurmd
  with 8 fake GPUs each, 2,000 one-GPU `true` jobs submitted as one array, its
  fastest path; profile `fast` by default): `started_jobs_per_s` from its result.json
  (first sbatch to last start, from slurmctld's own log);
* gpuloom's `started` scenario of bench/e2e_throughput.py on the same shape (16 nodes
  x 8 GPUs, 2,000 one-GPU `true` jobs): first submission to last JobStarted, from the
  log. `--gpuloom-mode jobs` submits them one request each (32 clients), `array` as one
  job array (one request, as Slurm's array), `both` runs each.

The two alternate (the order swaps every round) and never overlap. It prints every
measurement and, per gpuloom mode, the ratio gpuloom / Slurm of each round and their
mean; and what each side cost the machine: its busy CPU (all processes, from
/proc/stat) over the run, per job. On two cores that bounds the rate: at C ms of CPU
per job no system starts more than 2,000 / C jobs a second.

  python bench/slurm_ratio.py [--rounds 2] [--jobs 2000] [--profile fast]
                              [--gpuloom-mode both|jobs|array]

Needs root and apt access to Debian's archive (setup.sh installs slurmctld, slurmd,
slurm-client and munge when they are missing). Everything Slurm writes goes under a
temporary folder, removed after each round.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import mean

REPO_ROOT = Path(__file__).resolve().parents[1]
ANCHOR = Path(os.environ.get("GPULOOM_SLURM_ANCHOR", REPO_ROOT.parent / "shared/anchors/slurm"))
STARTED = re.compile(r"jobs started per second: ([\d.]+)")
MACHINE = re.compile(r"whole machine\s+([\d.]+) s")


class Run:
    """One side's run: jobs started per second, and the machine's busy CPU per job (ms)."""

    def __init__(self, rate: float, cpu_ms_per_job: float | None) -> None:
        self.rate, self.cpu_ms_per_job = rate, cpu_ms_per_job

    def cpu(self) -> str:
        return "?" if self.cpu_ms_per_job is None else f"{self.cpu_ms_per_job:.1f} ms"


def slurm_run(jobs: int, profile: str) -> Run:
    """One anchor run: setup, `bench.sh array`, teardown; Slurm's started jobs/s and the
    machine's busy CPU per job over the anchor's window (first sbatch to the end)."""
    with tempfile.TemporaryDirectory(prefix="slurm-anchor-") as run_dir:
        env = {**os.environ, "RUN_DIR": run_dir, "RESULTS_DIR": f"{run_dir}/results"}
        try:
            step(["bash", str(ANCHOR / "setup.sh"), profile], env)
            line = step(["bash", str(ANCHOR / "bench.sh"), "array", str(jobs), "ratio"], env)
            print(f"  slurm: {line.strip().splitlines()[-1]}", flush=True)
            result = json.loads(Path(run_dir, "results", "ratio", "result.json").read_text())
        finally:
            subprocess.run(["bash", str(ANCHOR / "teardown.sh")], env=env, capture_output=True)
    started = result.get("started_jobs_per_s")
    if not started or result.get("started") != jobs:
        raise SystemExit(f"Slurm did not start all {jobs} jobs: {result}")
    busy = result.get("cpu_s", {}).get("machine_busy")
    return Run(float(started), 1000 * busy / jobs if busy is not None else None)


def gpuloom_run(jobs: int, array: bool) -> Run:
    """One run of bench/e2e_throughput.py --scenario started; its started jobs/s and the
    machine's busy CPU per job during the run (first submission to the last job's end)."""
    command = [sys.executable, str(REPO_ROOT / "bench" / "e2e_throughput.py")]
    command += ["--scenario", "started", "--jobs", str(jobs), *(["--array"] if array else [])]
    env = {**os.environ, "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'libs'}"}
    output = step(command, env)
    found = STARTED.search(output)
    if found is None:
        raise SystemExit(f"no started figure in:\n{output[-2000:]}")
    print(f"  gpuloom ({'array' if array else 'jobs'}): {found.group(0)}", flush=True)
    machine = MACHINE.search(output)
    return Run(float(found.group(1)), 1000 * float(machine.group(1)) / jobs if machine else None)


def step(command: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(
            f"{' '.join(command)} failed ({done.returncode}):\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--profile", default="fast", choices=["default", "tuned", "fast"])
    parser.add_argument("--gpuloom-mode", default="both", choices=["both", "jobs", "array"])
    args = parser.parse_args()
    if not (ANCHOR / "setup.sh").exists():
        raise SystemExit(f"no Slurm anchor scripts in {ANCHOR} (set GPULOOM_SLURM_ANCHOR)")
    modes = {"both": [False, True], "jobs": [False], "array": [True]}[args.gpuloom_mode]
    ratios: dict[bool, list[float]] = {mode: [] for mode in modes}
    cpu: dict[str, list[str]] = {"Slurm": [], **{mode_name(mode): [] for mode in modes}}
    slurm_rates: list[float] = []
    for number in range(args.rounds):
        print(f"round {number + 1} of {args.rounds}", flush=True)
        runs: dict[bool, Run] = {}
        if number % 2 == 0:
            slurm = slurm_run(args.jobs, args.profile)
            runs = {mode: gpuloom_run(args.jobs, mode) for mode in modes}
        else:
            runs = {mode: gpuloom_run(args.jobs, mode) for mode in modes}
            slurm = slurm_run(args.jobs, args.profile)
        slurm_rates.append(slurm.rate)
        cpu["Slurm"].append(slurm.cpu())
        for mode, run in runs.items():
            ratios[mode].append(run.rate / slurm.rate)
            cpu[mode_name(mode)].append(run.cpu())
            print(f"  ratio gpuloom ({mode_name(mode)}) / Slurm: {run.rate / slurm.rate:.2f}")
    print(f"\nSlurm ({args.profile}, array of {args.jobs}): "
          f"{', '.join(f'{r:.1f}' for r in slurm_rates)} jobs started/s")  # fmt: skip
    for mode, found in ratios.items():
        name = "one job array" if mode else "one request per job"
        print(
            f"gpuloom ({name}) / Slurm, started jobs/s: "
            f"{', '.join(f'{r:.2f}' for r in found)}; mean {mean(found):.2f}"
        )
    for side, figures in cpu.items():
        print(f"busy CPU of the machine per job, {side}: {', '.join(figures)}")


def mode_name(array: bool) -> str:
    return "array" if array else "jobs"


if __name__ == "__main__":
    main()
