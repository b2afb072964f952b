"""`gpuloom nodes`: one row per node, grouped by the node's place in the topology."""

from __future__ import annotations

from collections.abc import Iterable

from rich.table import Table

from gpuloom.client.render import new_table
from gpuloom.client.schema import Gpu, Node
from gpuloom.events.units import MILLI_PER_CPU


def _mib(value: int) -> str:
    """Memory in GiB; `-` for 0 (a simulated node that declares none)."""
    return f"{value / 1024:.0f} GiB" if value else "-"


def _cores(cpu_milli: int) -> str:
    return f"{cpu_milli / MILLI_PER_CPU:g}" if cpu_milli else "-"


def _node_state(node: Node) -> str:
    if node["state"] != "ready":
        return f"[red]{node['state']}[/red]"
    if node.get("cordoned"):
        return f"[yellow]cordoned[/yellow] ({node['cordoned']})"
    return "[green]ready[/green]"


def _out_of_service(failed: list[Gpu]) -> str:
    """The GPUs a health check took out of service, each with what it saw: `0 (xid)`."""
    shown = []
    for gpu in failed:
        fault = gpu.get("unhealthy")
        shown.append(f"{gpu['index']} ({fault['check'] if fault else '?'})")
    return f"[red]{', '.join(shown)}[/red]" if shown else "-"


def topology_path(node: Node) -> tuple[str, ...]:
    """The node's domains from the loosest level to the tightest (`b1`, `r1`, `nvl-a`)."""
    return tuple(reversed(list((node.get("topology") or {}).values())))


def nodes_table(nodes: Iterable[Node]) -> Table:
    """One row per node, with its GPUs summed up by model, grouped by topology: sorted by
    their domains from the loosest level down (then by name), a section per domain of
    the loosest level, and the path in TOPOLOGY. Without topology: sorted by name."""
    ordered = sorted(nodes, key=lambda n: (topology_path(n), n["name"]))
    grouped = any(n.get("topology") for n in ordered)
    table = new_table()
    if grouped:
        levels = next(list(n["topology"]) for n in ordered if n.get("topology"))
        table.add_column(f"TOPOLOGY ({'/'.join(reversed(levels))})", no_wrap=True)
    table.add_column("NODE", no_wrap=True)
    table.add_column("STATE")
    table.add_column("GPU MODELS")
    table.add_column("GPUS USED", justify="right")
    table.add_column("FREE INDEXES")
    table.add_column("OUT OF SERVICE")
    table.add_column("JOBS")
    table.add_column("CPU", justify="right")
    table.add_column("MEMORY", justify="right")
    table.add_column("RUNTIMES")
    last_top: str | None = None
    for node in ordered:
        path = topology_path(node)
        if grouped and last_top is not None and path[:1] != (last_top,):
            table.add_section()
        last_top = path[0] if path else ""
        gpus = sorted(node["gpus"], key=lambda g: g["index"])
        models: dict[str, int] = {}
        for gpu in gpus:
            models[gpu["model"]] = models.get(gpu["model"], 0) + 1
        used = sum(1 for gpu in gpus if gpu["allocated"])
        failed = [gpu for gpu in gpus if gpu.get("unhealthy")]
        free = [
            str(gpu["index"]) for gpu in gpus if not gpu["allocated"] and not gpu.get("unhealthy")
        ]
        jobs = sorted({job for job in (gpu.get("job_id") for gpu in gpus) if job})
        name = node["name"] + (" (sim)" if node.get("simulated") else "")
        where = ["/".join(path) or "-"] if grouped else []
        table.add_row(
            *where,
            name,
            _node_state(node),
            ", ".join(f"{count} x {model}" for model, count in sorted(models.items())) or "-",
            f"{used}/{len(gpus)}",
            ",".join(free) or "-",
            _out_of_service(failed),
            ", ".join(jobs) or "-",
            _cores(node["cpu_milli"]),
            _mib(node["memory_mib"]),
            ", ".join(node.get("runtimes") or []) or "-",
        )
    return table
