"""The gateway explains pending jobs with one pass per position of its fold: a client
polling a pending job (or a thousand of them) costs one pass per change of the log, not
one per request (`ReadModel.explainer`)."""

from __future__ import annotations

from gpuloom.decide.explain import explain
from gpuloom.state import apply
from gpuloom.testing.builders import LogBuilder
from services.gateway.readmodel import ReadModel


def test_a_pass_is_made_once_per_position_of_the_fold_and_again_after_it_moves() -> None:
    log = LogBuilder()
    log.register("n1", 2)
    log.run_to_queue("a", gpus=2)
    log.run_to_queue("b", gpus=2)
    read_model = ReadModel(bus=None, sessions=None)  # type: ignore[arg-type]
    state = read_model.state
    for recorded in log:
        apply(state, recorded)
    first = read_model.explainer(["b"])
    assert read_model.explainer(["b"]) is first, "nothing folded since: the same pass"
    wider = read_model.explainer(["a", "b"])
    assert wider is not first and wider.wanted == frozenset({"a", "b"})
    assert read_model.explainer(["a"]) is wider
    found = explain(state, "b", brief=True, shared=wider)
    assert found is not None and found.reason == "Resources"  # a takes n1 first
    apply(state, log.request_cancel("a"))
    moved = read_model.explainer(["b"])
    assert moved is not wider, "the fold moved: a new pass"
    assert explain(state, "b", brief=True, shared=moved) == explain(state, "b", brief=True)
