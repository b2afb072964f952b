"""NodeRemoved: a node gone for good leaves the state, only when it holds no job; its
agent, back, registers it anew."""

from __future__ import annotations

from gpuloom.events import NodeRemoved
from gpuloom.state.rules.nodes import removal_problem
from gpuloom.testing.builders import LogBuilder, make_job_spec


def test_a_lost_node_without_jobs_is_removed_and_may_register_again() -> None:
    log = LogBuilder()
    log.register("n1", 2)
    log.register("n2", 1)
    log.lose("n2")
    log.append(NodeRemoved(node="n2", reason="decommissioned"))
    state = log.state()
    assert sorted(state.nodes) == ["n1"] and "n2" not in state.on_node
    assert not state.recent_voided
    log.register("n2", 1)
    assert log.state().nodes["n2"].phase == "ready"


def test_a_node_holding_a_job_is_not_removed() -> None:
    log = LogBuilder()
    log.register("n1", 2)
    log.submit("j1", make_job_spec(1))
    log.admit("j1")
    log.queue("j1")
    log.place("j1", "n1", [0])
    assert removal_problem(log.state(), "n1") == "node n1 still holds job(s) j1"
    log.append(NodeRemoved(node="n1"))
    state = log.state()
    assert "n1" in state.nodes
    assert state.recent_voided[-1].type == "NodeRemoved"
    assert removal_problem(state, "nope") == "unknown node nope"
