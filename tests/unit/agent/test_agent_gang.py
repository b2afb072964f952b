"""A gang's replicas on their agents: replica 0 first, reporting the rendezvous its agent
reserved; the others once that is in the log, with the launcher variables; and one
replica that fails ends the rest (`services.agent.reconcile`, `rendezvous`)."""

from __future__ import annotations

import socket

import pytest
from agent_events import register, write

from gpuloom.events import (
    JobAdmitted,
    JobFinished,
    JobPlaced,
    JobQueued,
    JobSpec,
    JobStarted,
    JobSubmitted,
    Outcome,
    PolicyRef,
    ReplicaAssignment,
    SliceRef,
)
from gpuloom.testing.memlog import MemoryLog
from services.agent.jobenv import job_environment
from services.agent.reconcile import Action, Ensure, Local, Report, Status, Stop, reconcile
from services.agent.rendezvous import (
    Rendezvous,
    launcher_environment,
    parse_master,
    parse_ports,
)

NODES = ("node-a", "node-b")


def gang(log: MemoryLog, job_id: str = "g1", replicas: int = 2, gpus: int = 2) -> None:
    """A gang of `replicas` replicas of `gpus` GPUs placed one replica per node (both nodes' GPUs)."""
    for node in NODES:
        register(log, node, gpus=gpus)
    spec = JobSpec(
        name=job_id, user="ann", account="research", command=["train"], gpus=gpus,
        replicas=replicas,
    )  # fmt: skip
    write(log, JobSubmitted(job_id=job_id, spec=spec))
    write(log, JobAdmitted(job_id=job_id))
    write(log, JobQueued(job_id=job_id, priority=0))
    assignments = [
        ReplicaAssignment(
            host=NODES[r],
            slices=[
                SliceRef(
                    node=NODES[r], index=i, uuid=f"GPU-{NODES[r]}-{i}", milli=1000, memory_mib=0
                )
                for i in range(gpus)
            ],
        )
        for r in range(replicas)
    ]
    write(log,
        JobPlaced(
            job_id=job_id, attempt=1, node=NODES[0], gpu_indexes=list(range(gpus)),
            gpu_uuids=[f"GPU-{NODES[0]}-{i}" for i in range(gpus)], replicas=assignments,
            basis_seq=log.state.seq, cycle_position=0, policy=PolicyRef(name="test", version=1),
        )
    )  # fmt: skip
    assert log.state.jobs[job_id].attempt == 1, log.state.recent_voided


def test_replica_0_starts_first_and_reports_its_rendezvous(log: MemoryLog) -> None:
    gang(log)
    [first] = reconcile(log.state, ["node-a"], {})
    assert isinstance(first, Ensure) and first.replica == 0 and first.master is None
    assert reconcile(log.state, ["node-b"], {}) == []  # replica 1 waits for it

    running = Local("node-a", 41, Status.RUNNING, master=("10.0.0.1", 29517))
    [report] = reconcile(log.state, ["node-a"], {("g1", 1, 0): running})
    assert isinstance(report, Report)
    assert report.decision.event == JobStarted(
        job_id="g1", attempt=1, node="node-a", pid=41, master_addr="10.0.0.1", master_port=29517
    )
    write(log, report.decision.event)

    [second] = reconcile(log.state, ["node-b"], {})
    assert isinstance(second, Ensure) and second.replica == 1
    assert second.phase == "placed"  # the job runs, this replica is still to start
    assert second.master == ("10.0.0.1", 29517) and second.hosts == NODES


def replica_1_ended(log: MemoryLog, outcome: Outcome, exit_code: int) -> list[Action]:
    """Both replicas of a gang started, replica 1 ended: what node-a's agent does."""
    gang(log, replicas=2)
    write(
        log,
        JobStarted(job_id="g1", attempt=1, node="node-a", pid=41, master_addr="h", master_port=9),
    )
    write(log, JobStarted(job_id="g1", attempt=1, node="node-b", replica=1, pid=42))
    write(log,
        JobFinished(job_id="g1", attempt=1, node="node-b", replica=1, outcome=outcome,
                    exit_code=exit_code, reason=f"exit code {exit_code}")
    )  # fmt: skip
    return reconcile(log.state, ["node-a"], {("g1", 1, 0): Local("node-a", 41, Status.RUNNING)})


def test_a_failed_replica_ends_the_others(log: MemoryLog) -> None:
    [stop] = replica_1_ended(log, "failed", 3)
    assert stop == Stop(("g1", 1, 0), "failed", "replica 1 failed with exit code 3: the gang ends")


def test_a_replica_that_never_started_ends_with_the_failed_one(log: MemoryLog) -> None:
    gang(log, replicas=2)
    write(log,   # replica 0 could not even start: replica 1 must not wait for it
        JobFinished(job_id="g1", attempt=1, node="node-a", outcome="failed", exit_code=None,
                    reason="could not start: no such program")
    )  # fmt: skip
    [report] = reconcile(log.state, ["node-b"], {})
    assert isinstance(report, Report)
    assert report.decision.event == JobFinished(
        job_id="g1", attempt=1, node="node-b", replica=1, outcome="failed", exit_code=None,
        reason="replica 0 failed: the gang ends",
    )  # fmt: skip
    write(log, report.decision.event)
    assert "g1" not in log.state.jobs  # ended (and, never having run, retired)


def test_a_succeeded_replica_leaves_the_others_running(log: MemoryLog) -> None:
    assert replica_1_ended(log, "succeeded", 0) == []


def test_only_replica_0_names_a_master() -> None:
    with pytest.raises(ValueError, match="only replica 0"):
        JobStarted(job_id="g", attempt=1, node="n", replica=1, master_addr="h", master_port=9)
    with pytest.raises(ValueError, match="go together"):
        JobStarted(job_id="g", attempt=1, node="n", master_addr="h")
    with pytest.raises(ValueError):
        JobStarted(job_id="g", attempt=1, node="n", master_addr="h;rm -rf", master_port=9)


def test_the_launcher_variables() -> None:
    env = launcher_environment(1, 2, 2, ("10.0.0.1", 29517))
    assert env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == "10.0.0.1"
    assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == "29517"
    assert (env["WORLD_SIZE"], env["RANK"], env["NODE_RANK"], env["LOCAL_RANK"]) == (
        "2",
        "1",
        "1",
        "0",
    )
    assert (env["PET_NNODES"], env["PET_NODE_RANK"], env["PET_NPROC_PER_NODE"]) == ("2", "1", "2")
    assert env["JAX_COORDINATOR_ADDRESS"] == "10.0.0.1:29517"


def test_a_single_job_gets_no_launcher_variables(log: MemoryLog) -> None:
    spec = JobSpec(name="s", user="ann", account="a", command=["x"], gpus=1)
    env = job_environment({}, spec, job_id="s", attempt=1, node="n", gpu_indexes=[0],
                          gpu_uuids=["u"], hosts=("n",), master=("h", 1))  # fmt: skip
    assert "MASTER_ADDR" not in env and "RANK" not in env


def test_reserving_skips_held_and_bound_ports() -> None:
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        ports = range(taken, taken + 3)
        rendezvous = Rendezvous("10.0.0.1", ports)
        address, port = rendezvous.reserve("g1", held=[taken + 1])
        assert address == "10.0.0.1" and port == taken + 2
        with pytest.raises(OSError, match="no free rendezvous port"):
            Rendezvous("h", range(taken, taken + 1)).reserve("g1", held=[])


def test_ports_and_master_records_parse() -> None:
    assert parse_ports("29500-29999") == range(29500, 30000)
    with pytest.raises(ValueError):
        parse_ports("0-10")
    assert parse_master("10.0.0.1 29517\n") == ("10.0.0.1", 29517)
    assert parse_master("garbage") is None
