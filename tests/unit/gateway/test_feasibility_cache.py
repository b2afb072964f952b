"""The gateway remembers `resources_problem`'s answers by request shape only while the
nodes are the same: a new node or a GPU moved to another pool asks again."""

from __future__ import annotations

from gpuloom.decide.admission import resources_problem
from gpuloom.events import GpuPoolChanged, JobSpec
from gpuloom.state import ClusterState
from gpuloom.testing.builders import LogBuilder, make_job_spec
from services.gateway.parts import Feasibility


def test_answers_are_resources_problems_and_asked_once_per_shape_and_nodes() -> None:
    log = LogBuilder()
    log.register("n1", 2, "A100-80GB")
    asked: list[JobSpec] = []

    def judge(state: ClusterState, spec: JobSpec) -> tuple[str | None, str] | None:
        asked.append(spec)
        return resources_problem(state, spec)

    cache = Feasibility()
    four, two, fraction = make_job_spec(4), make_job_spec(2), make_job_spec(1, gpu_milli=500)
    state = log.state()
    assert cache.answer(state, four, judge) == resources_problem(state, four) is not None
    assert cache.answer(state, make_job_spec(4, name="other", user="bob"), judge) is not None
    assert cache.answer(state, two, judge) is None
    assert len(asked) == 2  # the same shape (another name, user) was not asked again

    log.register("n2", 4, "A100-80GB")  # a bigger node: four GPUs fit now
    state = log.state()
    assert cache.answer(state, four, judge) is None and len(asked) == 3

    assert cache.answer(state, fraction, judge) is not None  # no vgpu GPU yet
    log.append(GpuPoolChanged(node="n1", index=0, pool="vgpu"))
    state = log.state()
    assert cache.answer(state, fraction, judge) is None and len(asked) == 5
