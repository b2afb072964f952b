"""An elastic gang on its agents: replica 0 reserves a rendezvous even alone, the
replicas get torchrun's elastic variables (no fixed WORLD_SIZE), a grown replica starts
once it is in the log, and a replica a shrink tells to leave is stopped alone, its
checkpoint signal first, while the rest runs on (`services.agent.reconcile`, `jobenv`)."""

from __future__ import annotations

from agent_events import register, write

from gpuloom.events import (
    JobAdmitted,
    JobFinished,
    JobGrown,
    JobPlaced,
    JobQueued,
    JobShrunk,
    JobSpec,
    JobStarted,
    JobSubmitted,
    PolicyRef,
    ReplicaAssignment,
    SliceRef,
)
from gpuloom.events.jobs import CheckpointSignal
from gpuloom.testing.memlog import MemoryLog
from services.agent.jobenv import job_environment
from services.agent.reconcile import Ensure, Local, Report, Status, Stop, reconcile

POLICY = PolicyRef(name="test", version=1)
SPEC = JobSpec(
    name="el", user="ann", account="research", command=["torchrun", "train.py"], gpus=1,
    replicas=3, min_replicas=1, preemptible=True,
    signal=CheckpointSignal(name="USR1", before_s=30),
)  # fmt: skip


def replica(node: str, index: int) -> ReplicaAssignment:
    uuid = f"GPU-{node}-{index}"
    return ReplicaAssignment(
        host=node, slices=[SliceRef(node=node, index=index, uuid=uuid, milli=1000, memory_mib=0)]
    )


def placed_alone(log: MemoryLog) -> None:
    """`el` placed with its minimum: one replica, on node-a."""
    register(log, "node-a", gpus=2)
    register(log, "node-b", gpus=2)
    for event in (JobSubmitted(job_id="el", spec=SPEC), JobAdmitted(job_id="el")):
        write(log, event)
    write(log, JobQueued(job_id="el", priority=0))
    write(log,
        JobPlaced(
            job_id="el", attempt=1, node="node-a", gpu_indexes=[0], gpu_uuids=["GPU-node-a-0"],
            replicas=[replica("node-a", 0)], basis_seq=log.state.seq, cycle_position=0,
            policy=POLICY,
        )
    )  # fmt: skip


def running_alone(log: MemoryLog) -> None:
    """`el` placed alone and started, with its rendezvous."""
    placed_alone(log)
    write(log,
        JobStarted(job_id="el", attempt=1, node="node-a", pid=40, master_addr="10.0.0.1",
                   master_port=29511)
    )  # fmt: skip


def test_replica_0_of_an_elastic_gang_reserves_a_rendezvous_even_alone(log: MemoryLog) -> None:
    placed_alone(log)
    [ensure] = reconcile(log.state, ["node-a"], {})
    assert isinstance(ensure, Ensure) and ensure.spec.elastic and ensure.hosts == ("node-a",)
    running = Local("node-a", 40, Status.RUNNING, master=("10.0.0.1", 29511))
    [report] = reconcile(log.state, ["node-a"], {("el", 1, 0): running})
    assert isinstance(report, Report) and isinstance(report.decision.event, JobStarted)
    assert report.decision.event.master_port == 29511


def test_the_replicas_get_torchruns_elastic_variables_and_no_world_size() -> None:
    env = job_environment(
        {"WORLD_SIZE": "7", "PET_NNODES": "9"}, SPEC, job_id="el", attempt=2, node="node-b",
        gpu_indexes=[1], gpu_uuids=["GPU-node-b-1"], replica=4,
        hosts=("node-a", "node-b"), master=("10.0.0.1", 29511),
    )  # fmt: skip
    assert env["PET_NNODES"] == "1:3"
    assert (env["PET_RDZV_BACKEND"], env["PET_RDZV_ENDPOINT"]) == ("c10d", "10.0.0.1:29511")
    assert env["PET_RDZV_ID"] == "el-2" and env["PET_NPROC_PER_NODE"] == "1"
    assert env["PET_MAX_RESTARTS"] == "24"
    assert (env["GPULOOM_REPLICA"], env["GPULOOM_MIN_REPLICAS"], env["GPULOOM_MAX_REPLICAS"]) == (
        "4", "1", "3",
    )  # fmt: skip
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29511")
    assert env["WORLD_SIZE"] == "7", "the agent's own environment, not a fixed world size"
    assert "RANK" not in env and "GPULOOM_REPLICAS" not in env


def test_a_grown_replica_starts_once_it_is_in_the_log(log: MemoryLog) -> None:
    running_alone(log)
    write(log,
        JobGrown(
            job_id="el", attempt=1, first=1, replicas=[replica("node-b", 1)],
            basis_seq=log.state.seq, cycle_position=0, policy=POLICY,
        )
    )  # fmt: skip
    assert log.state.jobs["el"].live_replicas() == [0, 1], log.state.recent_voided
    [ensure] = reconcile(log.state, ["node-b"], {})
    assert isinstance(ensure, Ensure) and ensure.replica == 1 and ensure.phase == "placed"
    assert ensure.master == ("10.0.0.1", 29511) and ensure.gpu_indexes == (1,)


def test_a_leaving_replica_is_stopped_alone_with_its_checkpoint_signal(log: MemoryLog) -> None:
    running_alone(log)
    write(log,
        JobGrown(
            job_id="el", attempt=1, first=1,
            replicas=[replica("node-b", 0), replica("node-b", 1)],
            basis_seq=log.state.seq, cycle_position=0, policy=POLICY,
        )
    )  # fmt: skip
    write(log, JobStarted(job_id="el", attempt=1, node="node-b", replica=1, pid=41))
    urgent = SPEC.model_copy(update={"name": "urgent", "min_replicas": None, "replicas": 1})
    write(log, JobSubmitted(job_id="urgent-1", spec=urgent))
    write(log,
        JobShrunk(
            job_id="el", attempt=1, replicas=[1, 2], by="urgent-1", reason="priority",
            basis_seq=log.state.seq, cycle_position=0, policy=POLICY,
        )
    )  # fmt: skip
    assert log.state.jobs["el"].leaving == {1, 2}, log.state.recent_voided
    here = {("el", 1, 1): Local("node-b", 41, Status.RUNNING)}
    actions = reconcile(log.state, ["node-b"], here)
    why = "left the elastic gang for urgent-1"
    assert actions[0] == Stop(("el", 1, 1), "preempted", why, checkpoint=True)
    report = actions[1]  # replica 2 had not started: it ends without starting
    assert isinstance(report, Report)
    assert report.decision.event == JobFinished(
        job_id="el", attempt=1, node="node-b", replica=2, outcome="preempted",
        exit_code=None, reason=f"{why} before start",
    )  # fmt: skip
    assert (
        reconcile(log.state, ["node-a"], {("el", 1, 0): Local("node-a", 40, Status.RUNNING)}) == []
    )
    write(log, report.decision.event)
    write(log,
        JobFinished(job_id="el", attempt=1, node="node-b", replica=1, outcome="preempted",
                    exit_code=143, reason=why)
    )  # fmt: skip
    job = log.state.jobs["el"]
    assert job.phase == "running" and job.live_replicas() == [0] and job.left == {1, 2}
    assert job.shrink_by is None and not job.leaving
    assert all(not gpu.holders for gpu in log.state.nodes["node-b"].gpus.values())
    assert (
        reconcile(log.state, ["node-a"], {("el", 1, 0): Local("node-a", 40, Status.RUNNING)}) == []
    )
