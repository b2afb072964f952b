"""`gpuloom sim`: replay the Alibaba GPU trace through gpuloom's placement policies."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from gpuloom.placement.policies import shipped_policies
from gpuloom.sim.replay import replay
from gpuloom.sim.report import Summary, plot, published_u100, summarize
from gpuloom.sim.trace import load_nodes, load_tasks, typical_workload

#: The trace beside the repository (`../shared/traces/...`), unless GPULOOM_TRACE_DIR says.
TRACE_DIR = Path(
    os.environ.get(
        "GPULOOM_TRACE_DIR",
        Path(__file__).resolve().parents[3].parent / "shared/traces/alibaba-gpu-v2023",
    )
)


def parse_seeds(text: str) -> list[int]:
    """`42-51` or `42,45,50` or `42`."""
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        if high:
            seeds += range(int(low), int(high) + 1)
        else:
            seeds.append(int(low))
    if not seeds:
        raise typer.BadParameter("no seeds")
    return seeds


def sim(
    pods: Annotated[Path, typer.Option(help="pod list CSV of the trace")] = TRACE_DIR
    / "openb_pod_list_default.csv",
    nodes: Annotated[Path, typer.Option(help="node list CSV")] = TRACE_DIR
    / "openb_node_list_gpu_node.csv",
    policy: Annotated[str, typer.Option(help="policy name(s), comma-separated")] = "fgd",
    seeds: Annotated[str, typer.Option(help="e.g. 42-51 or 42,43")] = "42-51",
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per policy")] = False,
    plot_file: Annotated[Path | None, typer.Option("--plot", help="PNG of U(x)")] = None,
    compare: Annotated[
        str, typer.Option(help="'published': the FGD paper's per-seed results beside ours")
    ] = "",
) -> None:
    """Replay a trace with the published protocol; print unallocated GPU % and more."""
    known = {p.name: p for p in shipped_policies()}
    names = [n.strip() for n in policy.split(",") if n.strip()]
    for name in names:
        if name not in known:
            raise typer.BadParameter(f"unknown policy {name!r} (known: {', '.join(sorted(known))})")
    for path in (pods, nodes):
        if not path.exists():
            raise typer.BadParameter(f"no such file: {path}")
    trace = pods.stem
    node_list, tasks = load_nodes(nodes), load_tasks(pods)
    workload = typical_workload(tasks, node_list)
    seed_list = parse_seeds(seeds)
    console = Console(stderr=as_json)
    summaries: list[Summary] = []
    for name in names:
        runs = []
        for seed in seed_list:
            run = replay(node_list, tasks, known[name], seed, workload)
            runs.append(run)
            console.print(f"{name} seed {seed}: {run.seconds:.1f} s", style="dim")
        summaries.append(summarize(trace, runs))
    results_dir = pods.parent / "fgd-published-results"
    if as_json:
        for summary in summaries:
            data = summary.as_json()
            if compare == "published":
                data["published_u100"] = published_u100(results_dir, trace, summary.policy)
            typer.echo(json.dumps(data))
    else:
        _print_table(console, summaries, results_dir if compare == "published" else None)
    if plot_file is not None:
        plot(summaries, plot_file)
        console.print(f"plot written to {plot_file}")


def _print_table(console: Console, summaries: list[Summary], published: Path | None) -> None:
    table = Table(title=f"{summaries[0].trace}, seeds {summaries[0].seeds}")
    for column in ["policy", "U(100) mean ± sd", "median", "U(110)", "U(120)", "U(130)"]:
        table.add_column(column, justify="right")
    table.add_column("frag amount / ratio @100", justify="right")
    table.add_column("failed per run", justify="left")
    table.add_column("s/seed", justify="right")
    if published:
        table.add_column("published U(100) mean", justify="right")
    for s in summaries:
        row = [
            s.policy,
            f"{s.u100_mean:.2f} ± {s.u100_sd:.2f}",
            f"{s.u100_median:.2f}",
            *(f"{s.curve.get(x, float('nan')):.2f}" for x in (110, 120, 130)),
            f"{s.frag_amount:.2f} / {s.frag_ratio:.1f}",
            " ".join(f"{k}:{v:g}" for k, v in s.failed_by_type.items()),
            f"{s.seconds_per_seed:.1f}",
        ]
        if published:
            values = published_u100(published, s.trace, s.policy)
            row.append(f"{sum(values.values()) / len(values):.2f}" if values else "-")
        table.add_row(*row)
    console.print(table)
    curve = Table(title="U(x), mean over seeds")
    curve.add_column("x")
    for s in summaries:
        curve.add_column(s.policy, justify="right")
    for x in range(75, 131, 5):
        curve.add_row(str(x), *(f"{s.curve.get(x, float('nan')):.2f}" for s in summaries))
    console.print(curve)
