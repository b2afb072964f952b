"""Snapshots of the folded state: folding on from one gives the same state as folding the
whole log, every field travels, and anything damaged or foreign is refused with a reason."""

from __future__ import annotations

import dataclasses
import hashlib
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from fixtures.actions import ACTIONS, MODELS
from fixtures.full_state import full_state, unpopulated
from fixtures.story import story
from fixtures.world import World
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import create_model

from gpuloom.events import AuditCompleted, Event
from gpuloom.placement import BestFit, placement_cycle
from gpuloom.state import ClusterState, JobState, NodeState, apply, fold
from gpuloom.state.snapshot import (
    FORMAT,
    VERSION,
    decode_snapshot,
    encode_snapshot,
    read_snapshot_header,
    snapshot_fingerprint,
)
from gpuloom.state.snapshot_schema import shape_fingerprint
from gpuloom.testing.builders import LogBuilder

ROOT = Path(__file__).resolve().parents[3]


def round_trip(state: ClusterState) -> ClusterState:
    return decode_snapshot(encode_snapshot(state))


class Recorder(World):
    """The random world of test_fold_properties, without its invariant checks after each
    event (they are that test's business): here only the log it plays matters."""

    def record(self, event: Event, after: float | None = None) -> bool:
        voided = self.state.voided
        apply(self.state, self.log.append(event, after=after))
        return self.state.voided == voided


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    models=st.lists(st.sampled_from(MODELS), min_size=2, max_size=3),
    gpus=st.integers(1, 4),
    actions=st.lists(ACTIONS, min_size=25, max_size=60),
)
def test_folding_on_from_a_snapshot_at_any_seq_gives_the_whole_fold(
    models: list[str], gpus: int, actions: list[object]
) -> None:
    world = Recorder(models, gpus)
    for action in actions:
        world.play(action)
    records = world.log.records
    whole = fold(records)
    prefix = ClusterState()
    for k in range(len(records) + 1):
        if k:
            apply(prefix, records[k - 1])
        data = encode_snapshot(prefix)
        restored = decode_snapshot(data)
        assert restored == prefix, f"round trip at {k}"
        assert fold(records[k:], restored) == whole, f"snapshot at {k}"
        assert encode_snapshot(prefix) == data, f"folding on from {k} changed the original"


def test_a_state_with_every_field_set_travels_whole() -> None:
    state = full_state()
    restored = round_trip(state)
    assert restored == state
    assert encode_snapshot(restored) == encode_snapshot(state)
    node, back = state.nodes["n1"], restored.nodes["n1"]
    assert back.lost_at is not None and back.lost_at.utcoffset() == node.lost_at.utcoffset()  # type: ignore[union-attr]
    assert type(next(iter(back.gpus))) is int
    assert set(restored.limits) == set(state.limits)


def test_the_full_state_sets_every_field() -> None:
    """Fails when the model gains a field `full_state` leaves at its default: set it there,
    so that the round trip above covers it."""
    assert unpopulated(full_state()) == []


def test_the_restored_state_shares_nothing_with_the_original() -> None:
    state = full_state()
    restored = round_trip(state)
    restored.jobs["b"].runs[0].charges += 1
    restored.nodes["n1"].gpus[3].holders.clear()
    restored.dependents["a"].add("z")
    assert restored != state
    assert state == full_state()


def test_a_value_that_does_not_fit_its_type_is_not_written() -> None:
    """A list where the model says tuple would come back a tuple, a different value."""
    state = full_state()
    state.jobs["b"].gpu_indexes = [1, 2]  # type: ignore[assignment]
    with pytest.raises(ValueError, match="gpu_indexes"):
        encode_snapshot(state)


def test_a_restored_state_makes_the_same_decisions() -> None:
    log = LogBuilder()
    log.register("n1", 4)
    log.run_to_queue("a", gpus=2, time_limit_s=600)
    log.place("a", "n1", [0, 1])
    log.start("a", "n1")
    log.run_to_queue("b", gpus=4)
    log.run_to_queue("c", gpus=1, time_limit_s=60)
    state = log.state()
    decisions = placement_cycle(state, BestFit())
    assert decisions, "the cycle decides something (a reservation, a backfill)"
    assert placement_cycle(round_trip(state), BestFit()) == decisions


def test_the_state_holds_only_what_the_log_means() -> None:
    """No field of the state, at any depth, is left out of its equality (a cache or a
    stamp for caches): snapshots carry every field, and caches live beside the state
    (`gpuloom.state.changes.ChangeFeed`), fed by whoever folds."""
    seen: set[type] = set()
    left_out = []

    def walk(tp: object) -> None:
        for arg in typing.get_args(tp):
            walk(arg)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp) and tp not in seen:
            seen.add(tp)
            hints = typing.get_type_hints(tp)
            for field in dataclasses.fields(tp):
                if not field.compare:
                    left_out.append(f"{tp.__name__}.{field.name}")
                walk(hints[field.name])

    walk(ClusterState)
    assert JobState in seen and NodeState in seen
    assert left_out == []


def test_equal_states_give_equal_bytes_in_any_process() -> None:
    """Sets are written sorted and the fingerprint hashes sorted names: neither hash
    randomisation nor set order reaches the bytes."""
    probe = (
        "import hashlib, sys; sys.path.insert(0, 'tests/unit');"
        "from fixtures.full_state import full_state;"
        "from gpuloom.state.snapshot import encode_snapshot, snapshot_fingerprint;"
        "print(snapshot_fingerprint(), hashlib.sha256(encode_snapshot(full_state())).hexdigest())"
    )
    expected = (
        f"{snapshot_fingerprint()} {hashlib.sha256(encode_snapshot(full_state())).hexdigest()}"
    )
    for seed in ("1", "2"):
        result = subprocess.run(
            [sys.executable, "-c", probe],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
            env={"PYTHONHASHSEED": seed, "PYTHONPATH": "libs"},
        )
        assert result.stdout.split() == expected.split()


def test_the_header_is_read_without_the_payload() -> None:
    state = fold(story())
    data = encode_snapshot(state)
    header = read_snapshot_header(data[:200])
    assert (header.format, header.version, header.fingerprint) == (
        FORMAT,
        VERSION,
        snapshot_fingerprint(),
    )
    assert header.seq == state.seq == len(story())
    assert header.compression == "zlib" and header.size > len(data)


# -- the fingerprint -------------------------------------------------------------------


@dataclasses.dataclass
class Grown(ClusterState):
    added: int = 0


def nested(*inner_fields: tuple[str, type] | tuple[str, object, object]) -> type:
    """A dataclass `Outer` holding dataclasses `Inner` with `inner_fields`, two levels down."""
    inner = dataclasses.make_dataclass("Inner", inner_fields)
    return dataclasses.make_dataclass("Outer", [("inner", dict[str, list[inner]])])  # type: ignore[valid-type]


def test_the_fingerprint_changes_with_the_model() -> None:
    assert shape_fingerprint(ClusterState) == snapshot_fingerprint()
    assert shape_fingerprint(Grown) != snapshot_fingerprint()
    before = shape_fingerprint(nested(("a", int)))
    assert shape_fingerprint(nested(("a", int))) == before
    assert shape_fingerprint(nested(("a", int), ("b", str))) != before
    assert shape_fingerprint(nested(("a", str))) != before
    assert shape_fingerprint(nested(("b", int))) != before


def test_the_fingerprint_changes_with_a_default() -> None:
    """A snapshot leaves out fields equal to their default: a version whose default
    differs must refuse it, not read the new default into it."""
    before = shape_fingerprint(nested(("a", int, dataclasses.field(default=0))))
    assert shape_fingerprint(nested(("a", int, dataclasses.field(default=0)))) == before
    assert shape_fingerprint(nested(("a", int, dataclasses.field(default=1)))) != before
    assert shape_fingerprint(nested(("a", int))) != before, "a default given or taken away"
    made = shape_fingerprint(nested(("a", list[int], dataclasses.field(default_factory=list))))
    assert made != shape_fingerprint(
        nested(("a", list[int], dataclasses.field(default_factory=lambda: [1])))
    )
    spec = [shape_fingerprint(nested(("s", create_model("Spec", a=(int, a))))) for a in (0, 1)]
    assert spec[0] != spec[1], "a pydantic model's default (a JobSpec's) counts too"


def test_the_fingerprint_changes_with_an_embedded_events_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(AuditCompleted, "VERSION", AuditCompleted.VERSION + 1)
    assert shape_fingerprint(ClusterState) != snapshot_fingerprint()


def test_a_field_the_codec_cannot_vouch_for_is_refused() -> None:
    @dataclasses.dataclass
    class Odd:
        thing: object

    with pytest.raises(TypeError, match="cannot carry"):
        shape_fingerprint(Odd)
