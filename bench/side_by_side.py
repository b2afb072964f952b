"""A benchmark of this tree against an earlier commit, side by side in one run.

This machine's speed varies about 2x from hour to hour, so a speed is only worth
stating as a ratio measured in one run. This script exports git ref `--ref` (`git
archive`, nothing in the repository changes), then runs the same bench script
(`bench/<name>.py` with the arguments after `--`) with the code of the ref and with
this tree's, alternately, `--rounds` times each, with this venv. It reads every
"N decisions/s", "N jobs/s" or "N events/s" figure a line prints (the line's text
before its first digit names it), and prints each figure's mean for both and the
ratio this tree / the ref (above 1: this tree is faster); a figure only this tree's
script prints, with its value in each round.

  python bench/side_by_side.py --ref 9294bdc [--rounds 3] placement_scale -- --nodes 1000
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from statistics import mean

from restart_catchup import REPO_ROOT, exported

RATE = re.compile(r"([\d,]+(?:\.\d+)?) (decisions/s|jobs/s|events/s)")


def figures(output: str) -> dict[str, float]:
    """Each rate a line prints, named by the line's start and its position on the line."""
    found: dict[str, float] = {}
    for line in output.splitlines():
        label = re.split(r"\d", line, maxsplit=1)[0].strip(" :(") or "?"
        for number, (value, unit) in enumerate(RATE.findall(line)):
            found[f"{label} #{number + 1} ({unit})"] = float(value.replace(",", ""))
    return found


def run(root: Path, script: str, args: list[str]) -> str:
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{root / 'libs'}"}
    done = subprocess.run(
        [sys.executable, str(root / "bench" / f"{script}.py"), *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{script} failed in {root}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", required=True, help="the git ref to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("script", help="a bench script's name, e.g. placement_scale")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then its arguments")
    options = parser.parse_args()
    args = options.args[1:] if options.args[:1] == ["--"] else options.args
    with tempfile.TemporaryDirectory(prefix="gpuloom-sbs-") as tmp:
        old_root = exported(options.ref, Path(tmp) / "ref")
        shared = REPO_ROOT.parent / "shared"  # the traces and anchors, beside the checkout
        if shared.exists():
            (Path(tmp) / "shared").symlink_to(shared)
        rates: dict[str, dict[str, list[float]]] = {
            "ref": defaultdict(list),
            "this": defaultdict(list),
        }
        for round_number in range(1, options.rounds + 1):
            for side, root in (("ref", old_root), ("this", REPO_ROOT)):
                output = run(root, options.script, args)
                for name, value in figures(output).items():
                    rates[side][name].append(value)
                print(f"round {round_number} {side}: done", flush=True)
    print(
        f"\n{options.script} {' '.join(args)}: {options.ref} vs this tree, {options.rounds} rounds each"
    )
    print(f"load: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores")
    for name in sorted(rates["this"]):
        old, new = rates["ref"].get(name), rates["this"][name]
        if not old:  # a figure the ref's script does not print
            print(
                f"{name}: this tree only, {mean(new):,.0f}  (rounds: {', '.join(f'{v:,.0f}' for v in new)})"
            )
            continue
        ratio = mean(new) / mean(old)
        print(f"{name}: {mean(old):,.0f} -> {mean(new):,.0f}  ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
