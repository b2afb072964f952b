"""The per-node view's own rules: what is routed where, and that a view never goes
back (a late record, a second dispatcher). Random logs check the whole against the
fold (`world.Dispatch`, in test_fold_properties)."""

from __future__ import annotations

import dataclasses

import pytest
from fixtures.actions import node_spec

from gpuloom.events import (
    JobAdmitted,
    JobCancelRequested,
    JobPlaced,
    JobQueued,
    JobSubmitted,
    NodeLost,
    NodeRegistered,
    PolicyRef,
)
from gpuloom.state import ClusterState, JobState, apply
from gpuloom.state.changes import ChangeFeed
from gpuloom.state.nodeview import (
    Gone,
    NodeView,
    Record,
    RecordError,
    decode_record,
    decode_seq,
    encode_gone,
    encode_position,
    encode_record,
    route,
)
from gpuloom.testing.builders import LogBuilder, make_job_spec


def placed_world() -> tuple[ClusterState, LogBuilder]:
    state, log = ClusterState(), LogBuilder()
    for event in (
        NodeRegistered(node="n1", spec=node_spec("n1", 2, "A100")),
        NodeRegistered(node="n2", spec=node_spec("n2", 2, "A100")),
        JobSubmitted(job_id="j1", spec=make_job_spec(gpus=1, env={"TOKEN": "only-for-n1"})),
        JobAdmitted(job_id="j1"),
        JobQueued(job_id="j1", priority=0),
        JobPlaced(
            job_id="j1",
            attempt=1,
            node="n1",
            gpu_indexes=[0],
            gpu_uuids=["GPU-n1-0-A100"],
            basis_seq=5,
            cycle_position=0,
            policy=PolicyRef(name="bestfit", version=1),
        ),
    ):
        apply(state, log.append(event))
    return state, log


def test_a_placed_job_goes_to_its_host_alone_and_a_tombstone_when_it_leaves() -> None:
    state, log = placed_world()
    sent: dict[str, frozenset[str]] = {}
    [record] = route(state, ["j1"], sent)
    assert isinstance(record, Record) and record.node == "n1"
    assert record.job.spec.env == {"TOKEN": "only-for-n1"}
    assert sent == {"j1": frozenset({"n1"})}
    feed, seq = ChangeFeed(), state.seq
    feed.apply(state, log.append(JobCancelRequested(job_id="j1")))
    assert feed.covers(state, seq) and feed.jobs_since(seq) == ["j1"]
    assert route(state, feed.jobs_since(seq), sent) == [Record("n1", state.jobs["j1"])]
    seq = state.seq
    feed.apply(state, log.append(NodeLost(node="n1", reason="silent")))  # it left n1
    assert feed.jobs_since(seq) == ["j1"]
    [gone] = route(state, ["j1"], sent)
    assert isinstance(gone, Gone) and (gone.node, gone.job_id) == ("n1", "j1")
    assert gone.seq == state.seq
    assert sent == {}


def test_a_view_never_takes_an_older_record_nor_one_from_before_a_tombstone() -> None:
    state, _ = placed_world()
    job = state.jobs["j1"]
    older = dataclasses.replace(job, last_seq=job.last_seq - 1, attempt=0)
    view = NodeView(["n1"])
    assert view.take("n1", job)
    assert not view.take("n1", older)  # a second dispatcher, late
    assert view.state.jobs["j1"] is job
    assert not view.take("n2", job), "a node the view does not serve"
    assert view.drop("n1", "j1", job.last_seq + 3)
    assert "j1" not in view.state.jobs and "n1" not in view.state.on_node
    assert not view.take("n1", job), "a record from before it left"
    later = dataclasses.replace(job, last_seq=job.last_seq + 7)
    assert view.take("n1", later), "placed again later"
    assert not view.drop("n1", "j1", job.last_seq + 3), "an old tombstone"


def test_a_view_moves_with_any_node_and_is_complete_node_by_node() -> None:
    view = NodeView(["n1", "n2"])
    view.advance("n1", 10)
    assert view.state.seq == 10 and view.complete("n1", 10) and not view.complete("n2", 1)
    view.advance("n2", 7)
    view.advance("n1", 4)  # never back
    assert view.state.seq == 10 and view.positions == {"n1": 10, "n2": 7}


def test_records_round_trip_and_another_shape_is_refused() -> None:
    state, _ = placed_world()
    job = state.jobs["j1"]
    body, headers = encode_record(job)
    back = decode_record(body, headers)
    assert isinstance(back, JobState) and back == job
    with pytest.raises(RecordError, match="shape"):
        decode_record(body, {**headers, "Gpuloom-Shape": "0000"})
    with pytest.raises(RecordError, match="damaged"):
        decode_record(b'{"job_id": 3}', headers)
    assert decode_seq(encode_gone(Gone("n1", "j1", 42))[0]) == 42
    assert decode_seq(encode_position(9)[0]) == 9
    for bad in (b"", b"[]", b'{"seq": -1}', b'{"seq": true}', b'{"seq": "1"}'):
        with pytest.raises(RecordError):
            decode_seq(bad)
