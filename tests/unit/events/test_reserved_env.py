"""A job's `env` may not set what the scheduler sets: the names, and admission's answer."""

from __future__ import annotations

import pytest

from gpuloom.decide.admission import decide_admission, env_problem
from gpuloom.events import JobAdmitted, JobArraySubmitted, JobRejected, JobSubmitted
from gpuloom.events.codec import decode, encode, make_envelope
from gpuloom.events.text import reserved_env_reason
from gpuloom.testing.builders import T0, LogBuilder, make_job_spec

RESERVED = [
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "NVIDIA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "GPULOOM_JOB_ID",
    "GPULOOM_ANYTHING",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PIPE_DIRECTORY",
    "LD_PRELOAD",
    "LD_AUDIT",
    "LD_DEBUG_OUTPUT",
]
ALLOWED = [
    "LD_LIBRARY_PATH",
    "PATH",
    "HOME",
    "OMP_NUM_THREADS",
    "cuda_visible_devices",  # names are case-sensitive: another variable
    "MY_CUDA_VISIBLE_DEVICES",
    "CUDA_HOME",
    "NCCL_DEBUG",
]


@pytest.mark.parametrize("name", RESERVED)
def test_a_name_the_scheduler_sets_is_reserved(name: str) -> None:
    assert reserved_env_reason(name)


@pytest.mark.parametrize("name", ALLOWED)
def test_a_name_a_job_may_set_is_not_reserved(name: str) -> None:
    assert reserved_env_reason(name) is None


def test_env_problem_names_the_first_reserved_variable_by_name() -> None:
    spec = make_job_spec(1, env={"SEED": "1", "LD_PRELOAD": "/x.so", "CUDA_VISIBLE_DEVICES": "0"})
    assert env_problem(spec) == (
        "env CUDA_VISIBLE_DEVICES selects the GPUs, which the scheduler sets to those it assigned"
    )
    assert env_problem(make_job_spec(1, env={"SEED": "1", "LD_LIBRARY_PATH": "/opt"})) is None


def test_admission_rejects_a_job_or_array_whose_env_sets_a_reserved_name() -> None:
    log = LogBuilder()
    log.register("n1", 2)
    log.submit("plain", make_job_spec(1, env={"SEED": "1"}))
    log.submit("sneaky", make_job_spec(1, env={"CUDA_VISIBLE_DEVICES": "0,1"}))
    array = make_job_spec(1, env={"GPULOOM_ARRAY_INDEX": "0"}, array=2)
    log.append(JobArraySubmitted(job_id="arr", spec=array))

    answers = {d.event.aggregate_id(): d.event for d in decide_admission(log.state())}

    assert answers["plain"] == JobAdmitted(job_id="plain")
    assert isinstance(answers["sneaky"], JobRejected)
    assert answers["sneaky"].reason.startswith("env CUDA_VISIBLE_DEVICES selects the GPUs")
    rejected = answers["arr"]  # the array's tasks, answered as one
    assert isinstance(rejected, JobRejected)
    assert rejected.reason == "env GPULOOM_ARRAY_INDEX is reserved for the scheduler (GPULOOM_*)"


def test_an_event_already_in_a_log_with_a_reserved_name_still_decodes() -> None:
    event = JobSubmitted(job_id="old", spec=make_job_spec(1, env={"CUDA_VISIBLE_DEVICES": "3"}))
    envelope = make_envelope(event, at=T0, by="gateway")
    decoded = decode(1, encode(envelope))
    assert isinstance(decoded.event, JobSubmitted)
    assert decoded.event.spec.env == {"CUDA_VISIBLE_DEVICES": "3"}
