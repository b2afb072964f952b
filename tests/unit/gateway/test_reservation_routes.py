"""/v1/reservations without an application (docs/reservations.md): a body resolved to
what the operator wants, or 422 naming the field; the GPUs chosen on the fold, or 422
naming what the cluster lacks, or 409 naming the running jobs that hold them; the
commands' refusals (409 for a name that exists, 404 for one that does not, 409 with the
fold's reason for a write the log voided all the same)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from test_refusals import gateway_after

from gpuloom.auth import OPERATOR, Principal
from gpuloom.events import (
    Event,
    NodeRegistered,
    Recorded,
    ReservationCreated,
    ReservationSpec,
    ReservationStarted,
    ReservedGpu,
)
from gpuloom.events.codec import make_envelope
from gpuloom.events.inventory import TopologyPlace
from gpuloom.testing.builders import LogBuilder, make_node_spec
from services.gateway.cluster.reservation_bodies import (
    NewReservation,
    ReservationChange,
    changed_wanted,
    new_wanted,
    view,
)
from services.gateway.cluster.reservations import create, delete, update
from services.gateway.publish import Publisher
from services.gateway.reads import Reads
from services.gateway.reads.reservations import Wanted, plan
from services.gateway.refusals import Invalid, Refused

HOUR = timedelta(hours=1)
ROOT = Principal("root", frozenset({OPERATOR}))


def cluster() -> LogBuilder:
    """n1: 4 A100 in rack r1; n2: 2 H100 in rack r2."""
    log = LogBuilder()
    for name, count, model, rack in (("n1", 4, "A100", "r1"), ("n2", 2, "H100", "r2")):
        spec = make_node_spec(name, count, model).model_copy(
            update={"topology": [TopologyPlace(level="rack", domain=rack)]}
        )
        log.append(NodeRegistered(node=name, spec=spec))
    return log


def new(now: datetime, **fields: Any) -> NewReservation:
    body = {"name": "r", "start": now + HOUR, "duration_s": 3600, "accounts": ["a"], **fields}
    return NewReservation.model_validate({k: v for k, v in body.items() if v is not None})


def loc(refused: object) -> tuple[Any, ...]:
    assert isinstance(refused, Invalid), refused
    [error] = refused.errors
    return tuple(error["loc"])


def reserve(log: LogBuilder, name: str, gpus: list[tuple[str, int]], start: datetime) -> None:
    spec = ReservationSpec(
        start=start,
        end=start + HOUR,
        gpus=[ReservedGpu(node=n, index=i) for n, i in gpus],
        users=["alice"],
    )
    log.append(ReservationCreated(name=name, spec=spec))
    assert name in log.state().reservations


def running(log: LogBuilder, job_id: str, node: str, gpus: list[int], **spec: Any) -> None:
    log.run_to_queue(job_id, gpus=len(gpus), **spec)
    log.place(job_id, node, gpus)
    log.start(job_id, node)


# --- the body ------------------------------------------------------------------------


def test_a_start_in_the_past_or_now_is_now_and_the_end_follows_the_duration() -> None:
    now = LogBuilder().now
    for start in ("now", now - HOUR):
        wanted = new_wanted(new(now, start=start, nodes=["n1"]), now)
        assert isinstance(wanted, Wanted)
        assert (wanted.start, wanted.end) == (now, now + HOUR)
    later = new_wanted(new(now, gpus={"count": 2}, end=now + 3 * HOUR, duration_s=None), now)
    assert isinstance(later, Wanted)
    assert (later.start, later.end, later.nodes) == (now + HOUR, now + 3 * HOUR, None)
    assert later.ask is not None and later.ask.count == 2


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"end": "past", "duration_s": None, "nodes": ["n1"]}, "end"),
        ({"end": "later", "nodes": ["n1"]}, "duration_s"),
        ({"duration_s": None, "nodes": ["n1"]}, "end"),
        ({}, "nodes"),
        ({"nodes": ["n1"], "gpus": {"count": 1}}, "gpus"),
        ({"nodes": ["n1"], "accounts": []}, "users"),
    ],
    ids=[
        "an end before the start",
        "both an end and a duration",
        "neither an end nor a duration",
        "neither nodes nor gpus",
        "both nodes and gpus",
        "nobody let in and no maint flag",
    ],
)
def test_a_body_that_says_too_much_or_too_little_names_the_field(
    fields: dict[str, Any], field: str
) -> None:
    now = LogBuilder().now
    times = {"past": now + HOUR / 2, "later": now + 2 * HOUR}
    body = new(now, **{k: times.get(v, v) if isinstance(v, str) else v for k, v in fields.items()})
    assert loc(new_wanted(body, now)) == ("body", field)


def test_a_maintenance_window_lets_nobody_in() -> None:
    now = LogBuilder().now
    wanted = new_wanted(new(now, nodes=["n1"], accounts=[], flags=["maint"]), now)
    assert isinstance(wanted, Wanted) and wanted.flags == ("maint",)


def test_a_change_replaces_what_it_gives_and_a_new_start_keeps_the_duration() -> None:
    log = cluster()
    reserve(log, "r", [("n1", 0)], log.now + HOUR)
    known = log.state().reservations["r"]
    moved = changed_wanted(known, ReservationChange(start=log.now + 2 * HOUR), log.now)
    assert isinstance(moved, Wanted)
    assert (moved.start, moved.end) == (log.now + 2 * HOUR, log.now + 3 * HOUR)
    assert (moved.kept, moved.users, moved.nodes) == ((("n1", 0),), ("alice",), None)
    longer = changed_wanted(
        known, ReservationChange(duration_s=7200, accounts=["b"], flags=["ignore_jobs"]), log.now
    )
    assert isinstance(longer, Wanted)
    assert (longer.start, longer.end) == (known.start, known.start + 2 * HOUR)
    assert (longer.accounts, longer.flags, longer.users) == (("b",), ("ignore_jobs",), ("alice",))
    early = ReservationChange(end=known.start - HOUR)
    assert loc(changed_wanted(known, early, log.now)) == ("body", "end")


def test_the_view_says_pending_until_placement_wrote_the_start() -> None:
    log = cluster()
    reserve(log, "r", [("n1", 0), ("n1", 1), ("n2", 0)], log.now + timedelta(seconds=5))
    shown = view(log.state().reservations["r"])
    assert (shown.state, shown.started, shown.nodes) == ("pending", False, ["n1", "n2"])
    assert [(g.node, g.index) for g in shown.gpus] == [("n1", 0), ("n1", 1), ("n2", 0)]
    log.append(ReservationStarted(name="r"), after=6)
    assert view(log.state().reservations["r"]).state == "active"


# --- the GPUs, on the fold -----------------------------------------------------------


def wanted(log: LogBuilder, **fields: Any) -> Wanted:
    made = new_wanted(new(log.now, **fields), log.now)
    assert isinstance(made, Wanted), made
    return made


def test_named_nodes_give_every_gpu_and_an_unknown_node_is_named() -> None:
    log = cluster()
    spec = plan(log.state(), wanted(log, nodes=["n2", "n1"]))
    assert isinstance(spec, ReservationSpec)
    assert [(g.node, g.index) for g in spec.gpus] == [("n1", i) for i in range(4)] + [
        ("n2", 0),
        ("n2", 1),
    ]
    assert loc(plan(log.state(), wanted(log, nodes=["n1", "n9"]))) == ("body", "nodes", 1)


@pytest.mark.parametrize(
    ("gpus", "field"),
    [
        ({"count": 1, "topology_level": "row"}, "topology_level"),
        ({"count": 1, "gpu_model": ["V100"]}, "gpu_model"),
        ({"count": 1, "pool": "vgpu"}, "pool"),
    ],
    ids=["an unknown topology level", "a model no node has", "a pool no GPU is in"],
)
def test_what_the_cluster_does_not_have_is_named(gpus: dict[str, Any], field: str) -> None:
    log = cluster()
    assert loc(plan(log.state(), wanted(log, gpus=gpus))) == ("body", "gpus", field)


def test_a_number_of_gpus_keeps_off_running_jobs_and_other_reservations() -> None:
    log = cluster()
    running(log, "busy", "n1", [0])
    reserve(log, "other", [("n1", 1)], log.now + HOUR / 2)
    spec = plan(log.state(), wanted(log, gpus={"count": 2, "gpu_model": ["A100"]}))
    assert isinstance(spec, ReservationSpec)
    assert [(g.node, g.index) for g in spec.gpus] == [("n1", 2), ("n1", 3)]
    rack = plan(log.state(), wanted(log, gpus={"count": 3, "topology_level": "rack"}))
    assert isinstance(rack, Refused) and rack.status == 409
    assert "one rack domain has at most 2" in rack.detail, rack.detail
    spread = plan(log.state(), wanted(log, gpus={"count": 3}))
    assert isinstance(spread, ReservationSpec)
    assert [(g.node, g.index) for g in spread.gpus] == [("n1", 2), ("n1", 3), ("n2", 0)]


def test_running_jobs_that_hold_the_gpus_at_the_start_are_named_unless_ignored() -> None:
    log = cluster()
    running(log, "forever", "n2", [0])
    running(log, "brief", "n2", [1], time_limit_s=60)
    refused = plan(log.state(), wanted(log, nodes=["n2"]))
    assert isinstance(refused, Refused) and refused.status == 409
    assert "forever" in refused.detail and "brief" not in refused.detail, refused.detail
    asked = plan(log.state(), wanted(log, gpus={"count": 2, "gpu_model": ["H100"]}))
    assert isinstance(asked, Refused) and asked.status == 409
    assert "at most 1" in asked.detail and "forever" in asked.detail, asked.detail
    made = plan(log.state(), wanted(log, nodes=["n2"], flags=["ignore_jobs"]))
    assert isinstance(made, ReservationSpec) and made.ignore_jobs


def test_another_reservation_on_the_gpus_at_an_overlapping_time_is_a_conflict() -> None:
    log = cluster()
    reserve(log, "first", [("n2", 0)], log.now + HOUR / 2)
    refused = plan(log.state(), wanted(log, nodes=["n2"]))
    assert isinstance(refused, Refused) and refused.status == 409
    assert "reservation first" in refused.detail
    after = plan(log.state(), wanted(log, nodes=["n2"], start=log.now + 2 * HOUR))
    assert isinstance(after, ReservationSpec), "after the other one ends"


# --- the commands, on a gateway whose log takes no write -----------------------------


async def test_the_commands_refuse_a_name_that_exists_or_does_not() -> None:
    log = cluster()
    reserve(log, "r", [("n1", 0)], log.now + HOUR)
    gateway = gateway_after(log)
    publisher, reads = Publisher(gateway), Reads(gateway)
    body = new(log.now, nodes=["n2"])
    assert await create(publisher, reads, body, ROOT, log.now) == Refused(
        409, "reservation r exists"
    )
    fresh = body.model_copy(update={"name": "s"})
    written = await create(publisher, reads, fresh, ROOT, log.now)
    assert isinstance(written, Refused) and written.status == 503, "checked, then written"
    change = ReservationChange(description="x")
    gone = await update(publisher, reads, "nowhere", change, ROOT, log.now)
    assert gone == Refused(404, "reservation nowhere not found")
    assert await delete(publisher, reads, "nowhere", ROOT) == gone


class Written(Publisher):
    """A publisher whose log takes every write, at sequence 1000."""

    async def publish(
        self, event: Event, msg_id: str | None = None, *, principal: Principal
    ) -> Recorded | Refused:
        envelope = make_envelope(event, at=datetime.now().astimezone(), by="gateway")
        return Recorded(1000, envelope, event)


class Raced(Reads):
    """Reads whose fold voided the write at 1000 (another gateway's got there first)."""

    async def voided_reason(self, seq: int) -> str | None:
        return "reservation s: GPU(s) n2/0 are in reservation t" if seq == 1000 else None


async def test_a_write_the_log_voided_all_the_same_is_a_conflict_with_the_folds_reason() -> None:
    log = cluster()
    gateway = gateway_after(log)
    body = new(log.now, name="s", nodes=["n2"])
    refused = await create(Written(gateway), Raced(gateway), body, ROOT, log.now)
    assert refused == Refused(409, "reservation s: GPU(s) n2/0 are in reservation t")
    applied = await create(Written(gateway), Reads(gateway), body, ROOT, log.now)
    assert applied is None
