"""The `gpuloom` command line: a thin edge over `GpuloomClient` and the services.

Contract:
- the gateway URL is `--url`, else `GPULOOM_GATEWAY_URL`, else 127.0.0.1 on
  `GPULOOM_GATEWAY_PORT`, else http://127.0.0.1:8080;
- every read command takes `--json` and then prints the gateway's JSON as is;
- errors print one red line on stderr and exit 1 (2 for usage errors), never a
  traceback; `submit --wait` exits 0 only when the job succeeded.

Tests pass `obj=CliState(transport=...)` to the runner to talk to a fake gateway.
"""

from __future__ import annotations

import logging
import signal as signal_module
import sys
from pathlib import PurePath
from typing import Annotated

import typer
from rich.console import RenderableType
from rich.markup import escape

from gpuloom.client import render
from gpuloom.client.api import DEFAULT_TIMEOUT_S
from gpuloom.client.archivecmds import app as archive_app
from gpuloom.client.buscmds import app as bus_app
from gpuloom.client.clustercmds import commands as cluster_commands
from gpuloom.client.context import CliState, JsonFlag, emit, err, fail, gateway, print_json
from gpuloom.client.errors import ApiError
from gpuloom.client.logcmds import audit_command, replay_command
from gpuloom.client.outputcmds import commands as output_commands
from gpuloom.client.policycmds import limits_app, priority_class_app
from gpuloom.client.reservationcmds import reservation_app
from gpuloom.client.serve import SERVICES, ServiceLoadError, UnknownServiceError, load_entrypoint
from gpuloom.client.tokencmds import token_app
from gpuloom.client.waiting import wait_for_final
from gpuloom.client.watch import watch_command
from gpuloom.runtime.collector import tune_collector
from gpuloom.sim.cli import sim as sim_command

app = typer.Typer(
    name="gpuloom",
    help="Submit and watch GPU jobs on a gpuloom cluster, and run its services.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}
JobId = Annotated[str, typer.Argument(help="Job id.", show_default=False)]


@app.callback()
def root(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            envvar="GPULOOM_GATEWAY_URL",
            help="Gateway URL \\[default: http://127.0.0.1:8080, or $GPULOOM_GATEWAY_PORT].",
            show_default=False,
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, help="Seconds to wait for each answer.")
    ] = DEFAULT_TIMEOUT_S,
) -> None:
    state = ctx.ensure_object(CliState)
    state.url = url or state.url
    state.timeout = timeout


def parse_env(pairs: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            fail(f"--env {pair!r}: expected KEY=VALUE", 2)
        env[key] = value
    return env


@app.command(context_settings={"allow_interspersed_args": False})
def submit(
    ctx: typer.Context,
    command: Annotated[
        list[str], typer.Argument(help="Program and its arguments (after --).", show_default=False)
    ],
    user: Annotated[
        str | None,
        typer.Option(help="Submit for this user (operators only) \\[default: the token's user]."),
    ] = None,
    account: Annotated[str, typer.Option(help="Account charged for the GPU time.")] = "default",
    name: Annotated[str | None, typer.Option(help="Job name \\[default: the program].")] = None,
    gpus: Annotated[int, typer.Option(min=0, help="Whole GPUs.")] = 0,
    gpu_model: Annotated[
        list[str] | None, typer.Option("--gpu-model", help="Allowed GPU model (repeatable).")
    ] = None,
    priority: Annotated[
        int | None,
        typer.Option(
            help="Priority, at most the class's (higher runs first) \\[default: the class's]."
        ),
    ] = None,
    priority_class: Annotated[
        str | None,
        typer.Option(
            "--priority-class",
            help="Priority class (gpuloom priority-class list) \\[default: the default class].",
        ),
    ] = None,
    preemptible: Annotated[
        bool,
        typer.Option(
            "--preemptible",
            help="A job of higher priority, in a class that may preempt, may stop and requeue it.",
        ),
    ] = False,
    time_limit: Annotated[
        int | None, typer.Option("--time-limit", min=1, help="Time limit in seconds.")
    ] = None,
    env: Annotated[
        list[str] | None, typer.Option("--env", help="KEY=VALUE for the job (repeatable).")
    ] = None,
    idempotency_key: Annotated[
        str | None, typer.Option(help="Submitting twice with one key makes one job.")
    ] = None,
    gpu_milli: Annotated[
        int | None,
        typer.Option(min=1, max=999, help="A fraction of each GPU, in milli-GPU (vGPU pool)."),
    ] = None,
    gpu_memory: Annotated[
        int | None, typer.Option("--gpu-memory", min=1, help="GPU memory per slice, MiB.")
    ] = None,
    cpu: Annotated[
        int | None, typer.Option("--cpu-milli", min=0, help="Host CPU, milli-cores.")
    ] = None,
    memory: Annotated[int | None, typer.Option("--memory", min=0, help="Host memory, MiB.")] = None,
    pool: Annotated[str | None, typer.Option(help="physical, vgpu or any.")] = None,
    locality: Annotated[
        str | None, typer.Option(help="local-only, local-first or any (remote vGPU).")
    ] = None,
    selector: Annotated[
        list[str] | None, typer.Option("--selector", help="LABEL=VALUE the host must have.")
    ] = None,
    replicas: Annotated[
        str | None,
        typer.Option(
            help="Gang size N, or MIN:MAX for an elastic gang (torchrun's --nnodes form):"
            " it starts with MIN or more, grows toward MAX, shrinks back to MIN when preempted.",
        ),
    ] = None,
    image: Annotated[
        str | None,
        typer.Option(help="Run the command in this container image (podman on the node)."),
    ] = None,
    topology: Annotated[
        str | None,
        typer.Option(
            "--topology",
            help="Every replica inside one domain of this topology level (a rack, an NVLink "
            "domain), or wait: gpuloom nodes shows the levels.",
        ),
    ] = None,
    topology_preferred: Annotated[
        str | None,
        typer.Option(
            "--topology-preferred",
            help="Inside one domain of this level if one fits, else in as few as can.",
        ),
    ] = None,
    array: Annotated[
        int | None,
        typer.Option(min=1, help="A job array of N tasks, each with GPULOOM_ARRAY_INDEX 0..N-1."),
    ] = None,
    reservation: Annotated[
        str | None,
        typer.Option(
            help="Run inside this advance reservation, on its GPUs, once it starts "
            "(gpuloom reservation list).",
        ),
    ] = None,
    dependency: Annotated[
        str | None,
        typer.Option(
            "--dependency",
            help="Start after other jobs, as sbatch: afterok:ID[:ID...] (they succeed), "
            "afterany:ID[:ID...] (they end), comma-separated.",
        ),
    ] = None,
    checkpoint: Annotated[
        str | None,
        typer.Option(
            "--signal",
            help="As sbatch: SIG[@SECONDS] (USR1@60): this signal that many seconds (60 by "
            "default) before the time limit, a preemption or a failed GPU stops the job.",
        ),
    ] = None,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait", help="Wait for the end (every task of an array); exit 0 only if it succeeded."
        ),
    ] = False,
) -> None:
    """Submit a job and print its id: gpuloom submit --gpus 1 -- python train.py"""
    state = ctx.ensure_object(CliState)
    job_env = parse_env(env or [])
    job_name = name or PurePath(command[0]).name or command[0]
    if topology and topology_preferred:
        raise typer.BadParameter("give --topology or --topology-preferred, not both")
    wanted = (
        {"level": topology, "mode": "required"}
        if topology
        else {"level": topology_preferred, "mode": "preferred"}
        if topology_preferred
        else None
    )
    with gateway(ctx) as client:
        answer = client.submit(
            name=job_name,
            user=user,
            account=account,
            command=command,
            gpus=gpus,
            gpu_model=gpu_model or [],
            priority=priority,
            priority_class=priority_class,
            time_limit_s=time_limit,
            env=job_env,
            idempotency_key=idempotency_key,
            resources={
                "gpu_milli": gpu_milli,
                "gpu_memory_mib": gpu_memory,
                "cpu_milli": cpu,
                "memory_mib": memory,
                "pool": pool,
                "locality": locality,
                "node_selector": parse_env(selector) if selector else None,
                "replicas": parse_replicas(replicas) if replicas else None,
                "image": image,
                "preemptible": preemptible or None,
                "array": array,
                "depends_on": parse_dependency(dependency) if dependency else None,
                "topology": wanted,
                "reservation": reservation,
                "signal": parse_signal(checkpoint) if checkpoint else None,
            },
        )
        typer.echo(answer["id"])
        if not wait:
            return
        tasks = answer.get("tasks") or [answer["id"]]
        ended = [wait_for_final(client, task, state.poll_interval_s) for task in tasks]
    failed = [job for job in ended if job["state"] != "succeeded"]
    for job in failed:
        detail = job.get("reason") or f"exit code {render.dash(job.get('exit_code'))}"
        err.print(f"{job['id']} ended {job['state']}: {escape(str(detail))}")
    if failed:
        raise typer.Exit(1)


#: sbatch's default warning: 60 seconds before.
SIGNAL_BEFORE_DEFAULT_S = 60


def parse_replicas(text: str) -> int | dict[str, int]:
    """`--replicas`: `N` (a gang of N), or `MIN:MAX` (an elastic gang, as torchrun's
    `--nnodes=MIN:MAX`). The gateway checks the bounds and that MIN is at most MAX."""
    least, colon, most = text.partition(":")
    if not least.isdigit() or (colon and not most.isdigit()):
        raise typer.BadParameter(f"{text!r}: a number of replicas, or MIN:MAX")
    return {"min": int(least), "max": int(most)} if colon else int(least)


def parse_signal(text: str) -> dict[str, object]:
    """sbatch's `--signal` (`USR1@60`, `SIGUSR2`, `10@30`) as the submission's `signal`:
    a name or number, and seconds before (60 when left out). The gateway checks the
    name and the bounds; `R:` and `B:` (sbatch's reservation and batch-shell flags)
    mean nothing here and are refused by name."""
    flags, colon, rest = text.rpartition(":")
    if colon:
        raise typer.BadParameter(f"{flags}: gpuloom signals the job's processes, no {flags}: flag")
    name, at, seconds = rest.partition("@")
    name = name.upper().removeprefix("SIG")
    if name.isdigit():
        try:
            name = signal_module.Signals(int(name)).name.removeprefix("SIG")
        except ValueError as exc:
            raise typer.BadParameter(f"no signal number {name}") from exc
    if at and not seconds.isdigit():
        raise typer.BadParameter(f"{seconds!r} is not a number of seconds")
    before = int(seconds) if at else SIGNAL_BEFORE_DEFAULT_S
    return {"name": name, "before_s": before}


#: sbatch's dependency types gpuloom has, and what each waits for.
DEPENDENCY_TYPES = {"afterok": "succeeded", "afterany": "finished"}
#: sbatch's other types: refused by name rather than taken for a job id.
SLURM_ONLY_TYPES = frozenset({"after", "afterburstbuffer", "aftercorr", "afternotok", "singleton"})


def parse_dependency(text: str) -> list[dict[str, str]]:
    """`afterok:A:B,afterany:C` -> the submission's `depends_on` (sbatch's syntax, as
    far as gpuloom has its types); a bare id waits for that job to succeed."""
    found: list[dict[str, str]] = []
    for part in text.split(","):
        kind, colon, ids = part.strip().partition(":")
        if not colon and kind not in SLURM_ONLY_TYPES:  # a bare job id
            kind, ids = "afterok", kind
        if kind not in DEPENDENCY_TYPES:
            known = ", ".join(DEPENDENCY_TYPES)
            raise typer.BadParameter(
                f"dependency type {kind!r}: gpuloom has {known}", param_hint="--dependency"
            )
        for job_id in ids.split(":"):
            if not job_id:
                raise typer.BadParameter(f"empty job id in {part!r}", param_hint="--dependency")
            found.append({"job": job_id, "when": DEPENDENCY_TYPES[kind]})
    return found


@app.command()
def jobs(
    ctx: typer.Context,
    state: Annotated[str | None, typer.Option(help="Only jobs in this state.")] = None,
    user: Annotated[str | None, typer.Option(help="Only this user's jobs.")] = None,
    account: Annotated[str | None, typer.Option(help="Only this account's jobs.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many jobs.")] = 50,
    offset: Annotated[int, typer.Option(min=0, help="Skip this many jobs.")] = 0,
    every: Annotated[
        bool, typer.Option("--all", help="Every job that matches, page after page.")
    ] = False,
    oldest: Annotated[bool, typer.Option("--oldest", help="The oldest first.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """List jobs, the newest first (`--oldest` for submission order): the latest 50
    (`--limit`), the next ones with `--offset`, or every one with `--all`."""
    order = "oldest" if oldest else "newest"
    with gateway(ctx) as client:
        answer = client.list_jobs(
            state=state, user=user, account=account, limit=ALL_PAGE if every else limit,
            offset=offset or None, order=order,
        )  # fmt: skip
        while every and len(answer["jobs"]) < answer["total"] - offset:
            more = client.list_jobs(
                state=state, user=user, account=account, limit=ALL_PAGE,
                offset=offset + len(answer["jobs"]), order=order,
            )  # fmt: skip
            if not more["jobs"]:
                break  # jobs that left the list meanwhile
            answer["jobs"].extend(more["jobs"])
    if as_json:
        print_json(answer)
    else:
        emit(render.jobs_table(answer, order=order, offset=offset))


#: Jobs asked per request by `gpuloom jobs --all` (the gateway's most per page).
ALL_PAGE = 5000


@app.command()
def show(ctx: typer.Context, job_id: JobId, as_json: JsonFlag = False) -> None:
    """Show one job and its event trail."""
    with gateway(ctx) as client:
        job = client.get_job(job_id)
        try:
            trail = client.job_events(job_id)["events"]
        except ApiError as exc:
            if exc.status != 403:
                raise
            trail = None  # another user's job: its details and trail are not ours to see
    if as_json:
        print_json({"job": job, "events": trail or []})
        return
    events = (
        render.events_table(trail)
        if trail is not None
        else "events: not shown (only its owner, its account's coordinators and operators"
        " may read a job's events)"
    )
    parts: list[RenderableType] = [render.job_details(job), ""]
    for table in (render.array_tasks_table(job), render.replicas_table(job)):
        if table is not None:
            parts += [table, ""]
    emit(*parts, events)


@app.command("queue")
def queue_command(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """Pending jobs in queue order with each priority factor (like sprio)."""
    with gateway(ctx) as client:
        answer = client.queue()
    if as_json:
        print_json(answer)
        return
    emit(render.queue_table(answer))


@app.command()
def explain(ctx: typer.Context, job_id: JobId, as_json: JsonFlag = False) -> None:
    """Why a job is pending: reason, queue position, jobs ahead, each node's verdict."""
    with gateway(ctx) as client:
        answer = client.explain(job_id)
    if as_json:
        print_json(answer)
        return
    emit(render.explanation(answer))


@app.command()
def cancel(ctx: typer.Context, job_id: JobId) -> None:
    """Ask for a job to be cancelled."""
    with gateway(ctx) as client:
        answer = client.cancel_job(job_id)
    emit(f"cancel requested for {escape(answer['id'])} (state: {answer['state']})")


@app.command(context_settings=PASS_THROUGH)
def serve(
    ctx: typer.Context,
    name: Annotated[
        str, typer.Argument(help=f"One of: {', '.join(SERVICES)}.", show_default=False)
    ],
) -> None:
    """Run a service in the foreground; extra arguments go to the service."""
    try:
        entrypoint = load_entrypoint(name)
    except UnknownServiceError as exc:
        fail(str(exc), 2)
    except ServiceLoadError as exc:
        fail(str(exc))
    try:
        entrypoint(list(ctx.args))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except Exception:
        # A crashed service's traceback is what its operator needs: log it, then exit 1.
        logging.getLogger("gpuloom.serve").exception("service %s crashed", name)
        raise typer.Exit(1) from None


@app.command()
def up() -> None:
    """Run the whole stack on this machine (embedded NATS, SQLite, every service)."""
    try:
        from gpuloom import devstack
    except ImportError as exc:
        fail(f"the development stack is not available: {exc}")
    devstack.main()


app.registered_commands += output_commands.registered_commands
app.registered_commands += cluster_commands.registered_commands
app.registered_groups += cluster_commands.registered_groups
app.add_typer(token_app, name="token")
app.add_typer(priority_class_app, name="priority-class")
app.add_typer(limits_app, name="limits")
app.add_typer(reservation_app, name="reservation")
app.add_typer(bus_app, name="bus")
app.add_typer(archive_app, name="archive")
app.command("watch")(watch_command)
app.command("sim")(sim_command)
app.command("audit")(audit_command)
app.command("replay")(replay_command)


def main() -> None:
    """Console-script entry point (`gpuloom`)."""
    tune_collector()  # audit, replay and sim fold whole logs
    try:
        app()
    except Exception as exc:  # last resort: a bug in the CLI itself, shown as one line
        err.print(f"[red]error: unexpected {type(exc).__name__}: {escape(str(exc))}[/red]")
        sys.exit(1)
