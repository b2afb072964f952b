"""Admission: admit a job some registered node could run, reject the rest with a reason."""

from __future__ import annotations

from gpuloom.decide.turns import in_turns
from gpuloom.events import Decision, JobAdmitted, JobRejected, JobSpec
from gpuloom.events.text import reserved_env_reason
from gpuloom.placement.engine import Context, NodeIndex
from gpuloom.placement.inputs import node_views, request_of
from gpuloom.placement.policies import BestFit
from gpuloom.placement.resources import host_fits
from gpuloom.placement.topology import place, topology_shortfall
from gpuloom.queueing.classes import class_problem
from gpuloom.queueing.limits import SubmitTally
from gpuloom.state import ClusterState
from gpuloom.state.dependencies import dependency_status
from gpuloom.state.feasibility import KUBERNETES
from gpuloom.state.tenancy import membership_problem


def rejection_reason(state: ClusterState, spec: JobSpec) -> str | None:
    """Why `spec` is rejected at admission: its user may not use the account, a job it
    depends on is unknown or ended otherwise than it needs, or no registered node could
    ever run it (`resources_problem`)."""
    membership = membership_problem(spec.user, spec.account, state.accounts)
    if membership is not None:
        return membership
    if spec.kubernetes is not None:
        # A pod waits, Pending, for a node that can run it (one may join: a cluster
        # autoscaler's, a node made at the same time): Kubernetes' way, never a rejection.
        return None
    if not state.nodes:
        return NO_NODE
    status, why = dependency_status(state, spec.depends_on)
    if status == "never":
        return why
    found = resources_problem(state, spec)
    return None if found is None else found[1]


NO_NODE = "no node is registered"


def resources_problem(state: ClusterState, spec: JobSpec) -> tuple[str | None, str] | None:
    """The request field and why, when no registered node (ready or lost: lost nodes may
    come back) could ever run `spec`; None when one could. The field is None where no
    one field is at fault (CPU, memory and labels together).

    "Ever" means on an idle cluster: the job is placed, with the shared placement
    rules, on views of every registered node with nothing allocated. The reason
    names the first rule nobody can satisfy. The gateway asks this before it writes a
    submission (422, as sbatch refuses such a job at once); admission asks it again
    of every submission in the log.
    """
    nodes = [state.nodes[name] for name in sorted(state.nodes)]
    if not nodes:
        return None, NO_NODE
    if spec.kubernetes is not None and not any(KUBERNETES in node.spec.runtimes for node in nodes):
        return "kubernetes", "no Kubernetes node is registered"
    if spec.kubernetes is None and all(KUBERNETES in node.spec.runtimes for node in nodes):
        return None, (
            "every registered node is a Kubernetes node, which runs only pods: ask for "
            "gpuloom.io/gpu in a pod's limits instead (docs/kubernetes.md)"
        )
    if spec.image is not None and not any(node.spec.runtimes for node in nodes):
        return "image", "no node has a container runtime (podman) to run an image"
    if spec.topology is not None:
        levels = sorted({place.level for node in nodes for place in node.spec.topology})
        if spec.topology.level not in levels:
            return "topology.level", (
                f"no node names a {spec.topology.level!r} level "
                f"(levels in the cluster: {', '.join(levels) or 'none'}; docs/topology.md)"
            )
    if spec.gpus == 0:
        idle = node_views(state, idle=True, include_lost=True)
        if any(host_fits(request_of(spec), view) for view in idle):
            return None
        return None, "no node has the CPU, memory and labels the job asks for"
    gpus = [gpu for node in nodes for gpu in node.gpus.values()]
    models = sorted({gpu.model for gpu in gpus})
    wanted = spec.gpu_model
    if wanted and not set(wanted) & set(models):
        return "gpu_model", (
            f"no node has GPU model {' or '.join(wanted)} "
            f"(models in the cluster: {', '.join(models) or 'none'})"
        )
    pool = "vgpu" if spec.gpu_milli is not None else spec.pool
    if pool != "any" and not any(gpu.pool == pool for gpu in gpus):
        return ("gpu_milli" if spec.gpu_milli is not None else "pool"), (
            f"no GPU is in the {pool} pool"
        )
    views = node_views(state, idle=True, include_lost=True)
    index = NodeIndex(views)
    if place(request_of(spec), index, BestFit(), Context()) is not None:
        return None
    if spec.topology is not None and spec.topology.mode == "required":
        level = spec.topology.level
        return "topology", (
            f"even idle, {topology_shortfall(request_of(spec), index, level)}"
            f" (it must be inside one {level})"
        )
    what = f"{' or '.join(wanted)} GPUs" if wanted else "GPUs"
    if spec.gpu_milli is not None:
        what = f"slices of {spec.gpu_milli} milli-GPU on distinct {what}"
    largest = max(
        sum(
            1
            for gpu in node.gpus.values()
            if (not wanted or gpu.model in wanted) and (pool == "any" or gpu.pool == pool)
        )
        for node in nodes
    )
    extras = []
    if spec.pool != "any":
        extras.append(f"from the {spec.pool} pool")
    if spec.locality != "local-only":
        extras.append(spec.locality)
    needs = f"job needs {spec.gpus} {what}" + (f" ({', '.join(extras)})" if extras else "")
    if largest < spec.gpus:
        remote = "" if spec.locality == "local-only" else " and remote vGPU cannot make up the rest"
        return "gpus", f"{needs} but the largest node has {largest}{remote}"
    if spec.least_replicas > 1:
        return "replicas", (
            f"{spec.least_replicas} replicas of {spec.gpus} {what} each do not fit in the whole "
            "cluster at once (with the CPU, memory and labels the job asks for)"
        )
    return None, f"{needs} but no node has them with the CPU, memory and labels the job asks for"


def reservation_use_problem(state: ClusterState, spec: JobSpec) -> str | None:
    """Why `spec` may not run in the advance reservation it names (docs/reservations.md):
    none of that name, a maintenance window, a user or account it does not let in, or
    more GPUs than it holds. The gateway answers it as a 4xx naming `reservation`."""
    name = spec.reservation
    if name is None:
        return None
    booked = state.reservations.get(name)
    if booked is None:
        return f"reservation {name} does not exist (or has ended)"
    if booked.maint:
        return f"reservation {name} is a maintenance window: no job runs in it"
    if not booked.lets_in(spec.user, spec.account):
        return f"reservation {name} does not let user {spec.user} or account {spec.account} in"
    wanted = spec.gpus * spec.least_replicas
    if wanted > len(booked.gpus):
        return f"the job asks {wanted} GPUs; reservation {name} holds {len(booked.gpus)}"
    return None


def time_limit_problem(spec: JobSpec, max_time_limit_s: int | None) -> str | None:
    """Why the job's time limit is over the cluster's maximum (Slurm's MaxTime), if it is."""
    if max_time_limit_s is None or spec.time_limit_s is None:
        return None
    if spec.time_limit_s > max_time_limit_s:
        return (
            f"time_limit_s {spec.time_limit_s} is over the cluster's maximum of "
            f"{max_time_limit_s} s"
        )
    return None


def env_problem(spec: JobSpec) -> str | None:
    """Why the job's `env` sets a variable the scheduler reserves (the first by name), if so.

    The gateway refuses such a submission; this catches one that reached the log
    another way (an older gateway, a direct publish).
    """
    for name in sorted(spec.env):
        reason = reserved_env_reason(name)
        if reason is not None:
            return f"env {name} {reason}"
    return None


def decide_admission(state: ClusterState, max_time_limit_s: int | None = None) -> list[Decision]:
    """Answer the submitted jobs without a pending cancel, at most a round's worth, users
    taking turns and an array's waiting tasks with one event (`decide.turns`), each
    user's in submission order.

    `max_time_limit_s` is the cluster's MaxTime (configuration); None: no maximum
    but the contract's own (a 32-bit number of seconds). The per-identity limits
    (`max_submit_jobs`, `max_array_size`) are enforced here, in the order judged: the
    jobs admitted earlier (in the log, and in this pass) count against the later ones
    (`SubmitTally`); a user's own jobs are judged in submission order.
    """
    decisions: list[Decision] = []
    reasons: dict[object, str | None] = {}  # the same request, the same answer
    tally = SubmitTally(state)
    waiting = (state.jobs[j] for j in state.submitted)
    for unit in in_turns(j for j in waiting if not j.cancel_requested):  # the queue cancels those
        job = unit.first  # an array's tasks share its spec, and its answer (`SubmitTally`)
        try:
            reason = _judge(state, job.spec, max_time_limit_s, reasons) or tally.problem(job)
        except Exception as exc:  # containment: one job no rule foresaw cannot stop the rest
            reason = f"admission could not judge this job: {type(exc).__name__}: {exc}"[:1000]
        answered = unit.answered_id
        event: JobAdmitted | JobRejected = (
            JobAdmitted(job_id=answered)
            if reason is None
            else JobRejected(job_id=answered, reason=reason)
        )
        decisions.append(Decision(event, unit.msg_id("admission"), job.last_event_id))
    return decisions


def _judge(
    state: ClusterState,
    spec: JobSpec,
    max_time_limit_s: int | None,
    reasons: dict[object, str | None],
) -> str | None:
    """Why `spec` is rejected, or None; `reasons` remembers answers by request shape."""
    reason = (
        time_limit_problem(spec, max_time_limit_s)
        or env_problem(spec)
        or membership_problem(spec.user, spec.account, state.accounts)
        or class_problem(state, spec)
        or reservation_use_problem(state, spec)
    )
    if reason is not None:
        return reason
    shape = (request_of(spec), tuple((d.job, d.when) for d in spec.depends_on))
    if shape not in reasons:
        reasons[shape] = rejection_reason(state, spec)
    return reasons[shape]
