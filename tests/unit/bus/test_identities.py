"""The bus's table of who writes what (design §2.3), and the subjects it rests on.

nats-server enforces these permissions; here the table itself is checked: every event
type has exactly one writer, no identity but admin may publish another's events, an
agent only for its own nodes, and a body must agree with its subject.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from events.test_codec import EXAMPLES

from gpuloom.bus.identities import (
    ADMIN,
    AGENT,
    ALSO_WRITTEN_BY,
    READER,
    SERVICES,
    WRITERS,
    Identity,
    agent_permissions,
    event_permission,
    identities,
    may_publish,
    nodes_served,
    subject_matches_pattern,
)
from gpuloom.bus.jsapi import DURABLES
from gpuloom.bus.keyring import Keyring
from gpuloom.events import (
    ALL_EVENT_CLASSES,
    EVENT_TYPES,
    JobFinished,
    JobPlaced,
    JobStarted,
    JobSubmitted,
    MalformedEvent,
    decode,
    encode,
    make_envelope,
)
from gpuloom.events.codec import Recorded
from gpuloom.events.subjects import NODE_BOUND_TYPES, job_subjects, subject_for
from gpuloom.natsserver import users_config
from gpuloom.state import apply
from gpuloom.testing.builders import T0, LogBuilder, make_job_spec

STREAM = "GPULOOM"


def table() -> list[Identity]:
    keys = {name: f"U{name.upper()}" for name in (*SERVICES, READER, ADMIN)}
    keys |= {"agent-a": "UAGENTA", "agent-b": "UAGENTB"}
    return identities(keys, {"agent-a": ["node-a", "node-c"], "agent-b": ["node-b"]}, STREAM)


def subject_of(event_type: str, node: str = "node-a") -> str:
    aggregate, writer = WRITERS[event_type]
    if aggregate == "node" and writer == AGENT:  # about the node itself: its name is the id
        return f"gpuloom.evt.node.{node}.{event_type}"
    tail = f".{node}" if event_type in NODE_BOUND_TYPES else ""
    return f"gpuloom.evt.{aggregate}.x1.{event_type}{tail}"


def test_every_event_type_has_exactly_one_writer_and_its_aggregate() -> None:
    assert set(EVENT_TYPES) <= set(WRITERS), set(EVENT_TYPES) - set(WRITERS)
    for cls in ALL_EVENT_CLASSES:
        aggregate, writer = WRITERS[cls.TYPE]
        assert aggregate == cls.AGGREGATE, cls.TYPE
        assert writer in (*SERVICES, AGENT, ADMIN), cls.TYPE
    # the gateway's coming AccountCoordinatorsSet is already its own
    assert WRITERS["AccountCoordinatorsSet"] == ("account", "gateway")


@pytest.mark.parametrize("event_type", sorted(WRITERS))
def test_only_the_writer_and_admin_may_publish_an_event(event_type: str) -> None:
    _, writer = WRITERS[event_type]
    allowed = {
        i.name for i in table() if may_publish(i.permissions, subject_of(event_type, "node-a"))
    }
    expected = {ADMIN, "agent-a"} if writer == AGENT else {ADMIN, writer}
    # the Kubernetes services, for the facts whose source the Kubernetes API is
    expected |= set(ALSO_WRITTEN_BY.get(event_type, ()))
    assert allowed == expected


def test_an_agent_publishes_only_for_its_own_nodes() -> None:
    by_name = {i.name: i.permissions for i in table()}
    mine, theirs = by_name["agent-a"], by_name["agent-b"]
    for event_type in ("JobStarted", "JobFinished"):
        assert may_publish(mine, subject_of(event_type, "node-c"))
        assert not may_publish(mine, subject_of(event_type, "node-b"))
        assert may_publish(theirs, subject_of(event_type, "node-b"))
        legacy = f"gpuloom.evt.job.x1.{event_type}"  # the 5-token subject: admin only
        assert not may_publish(mine, legacy) and not may_publish(theirs, legacy)
    assert may_publish(mine, subject_of("GpuUnhealthy", "node-c"))
    assert not may_publish(mine, subject_of("GpuUnhealthy", "node-b"))
    assert not may_publish(mine, subject_of("GpuHealthy", "node-a")), "an operator resumes"
    assert may_publish(mine, "gpuloom.hb.node-a") and not may_publish(mine, "gpuloom.hb.node-b")
    assert "gpuloom.ctl.agent.node-a.>" in (mine.subscribe or ())
    assert "gpuloom.ctl.agent.node-b.>" not in (mine.subscribe or ())
    assert mine.allow_responses


def test_dead_letters_only_on_ones_own_subject() -> None:
    by_name = {i.name: i.permissions for i in table()}
    for name in SERVICES:
        assert may_publish(by_name[name], f"gpuloom.dlq.{name}.log")
        for other in set(SERVICES) - {name}:
            assert not may_publish(by_name[name], f"gpuloom.dlq.{other}.log"), (name, other)
    # agents fold no log: they have nothing to dead-letter
    assert not may_publish(by_name["agent-a"], "gpuloom.dlq.agent.log")
    assert not may_publish(by_name["agent-a"], "gpuloom.dlq.queue.log")


def test_an_agent_reads_its_own_nodes_view_and_nothing_of_the_log() -> None:
    """Part of the log an agent may not read in any way: no consumer of the log, no
    direct get; of the view, only a consumer filtered to one of its own nodes (the
    server checks the filter in the request against the one in the subject)."""
    by_name = {i.name: i.permissions for i in table()}
    mine = by_name["agent-a"]
    api = "$JS.API"
    for denied in (
        f"{api}.CONSUMER.CREATE.{STREAM}",
        f"{api}.CONSUMER.CREATE.{STREAM}.c1",
        f"{api}.CONSUMER.CREATE.{STREAM}.c1.gpuloom.evt.>",
        f"{api}.CONSUMER.MSG.NEXT.{STREAM}.c1",
        f"{api}.DIRECT.GET.{STREAM}",
        f"{api}.STREAM.MSG.GET.{STREAM}",
        f"{api}.CONSUMER.CREATE.{STREAM}_VIEW",
        f"{api}.CONSUMER.CREATE.{STREAM}_VIEW.c1",
        f"{api}.CONSUMER.CREATE.{STREAM}_VIEW.c1.gpuloom.view.>",
        f"{api}.CONSUMER.CREATE.{STREAM}_VIEW.c1.gpuloom.view.node-b.>",
        f"{api}.CONSUMER.CREATE.{STREAM}_VIEW.c1.gpuloom.view.*.>",
        # its own node's view, under a name not among the node's few: no more consumers
        f"{api}.CONSUMER.CREATE.{STREAM}_VIEW.c1.gpuloom.view.node-a.>",
        f"{api}.CONSUMER.CREATE.{STREAM}_VIEW.view-node-a-2.gpuloom.view.node-a.>",
        f"{api}.CONSUMER.CREATE.{STREAM}_VIEW.view-node-b-0.gpuloom.view.node-b.>",
        f"{api}.CONSUMER.CREATE.{STREAM}_VIEW.view-node-b-0.gpuloom.view.node-a.>",
        f"{api}.CONSUMER.MSG.NEXT.{STREAM}_VIEW.c1",
        f"{api}.CONSUMER.DELETE.{STREAM}_VIEW.view-node-b-0",
        f"{api}.DIRECT.GET.{STREAM}_VIEW",
        f"{api}.STREAM.MSG.GET.{STREAM}_VIEW",
        f"{api}.STREAM.INFO.{STREAM}_VIEW",
        "gpuloom.view.node-a.position",
        "gpuloom.dispatch.sync.node-b",
    ):
        assert not may_publish(mine, denied), denied
    for allowed in (
        f"{api}.CONSUMER.CREATE.{STREAM}_VIEW.view-node-a-0.gpuloom.view.node-a.>",
        f"{api}.CONSUMER.CREATE.{STREAM}_VIEW.view-node-a-1.gpuloom.view.node-a.>",
        f"{api}.CONSUMER.CREATE.{STREAM}_VIEW.view-node-c-0.gpuloom.view.node-c.>",
        f"{api}.CONSUMER.MSG.NEXT.{STREAM}_VIEW.view-node-a-0",
        f"{api}.CONSUMER.DELETE.{STREAM}_VIEW.view-node-a-1",
        f"{api}.STREAM.INFO.{STREAM}",
        "gpuloom.dispatch.sync.node-a",
    ):
        assert may_publish(mine, allowed), allowed
    assert not any(s.startswith("gpuloom.evt") for s in mine.subscribe or ())


def test_only_dispatch_writes_the_view_and_hears_the_agents_syncs() -> None:
    by_name = {i.name: i.permissions for i in table()}
    for name, permissions in by_name.items():
        writes = may_publish(permissions, "gpuloom.view.node-a.job.j1")
        assert writes == (name in ("dispatch", ADMIN)), name
    assert "gpuloom.dispatch.sync.*" in (by_name["dispatch"].subscribe or ())
    assert not may_publish(by_name["dispatch"], "gpuloom.evt.job.j1.JobPlaced")


def test_the_reader_publishes_nothing_but_read_calls() -> None:
    reader = next(i.permissions for i in table() if i.name == READER)
    assert reader.publish is not None
    assert all(p.startswith(("$JS.API.", "$JS.FC.")) for p in reader.publish), reader.publish
    assert not any("CREATE.GPULOOM_DLQ" in p or "STREAM.CREATE" in p for p in reader.publish)
    assert not may_publish(reader, "gpuloom.evt.job.x.JobSubmitted")
    assert not may_publish(reader, "gpuloom.dlq.reader.log")


def test_only_the_admin_creates_streams_and_only_the_owner_uses_a_durable() -> None:
    """A create call carries a whole configuration (republish, sources) that no
    permission restricts: the admin creates every stream and bucket at setup."""
    for identity in table():
        for stream in (STREAM, f"{STREAM}_DLQ", "OBJ_GPULOOM_SNAP_PLACEMENT", "ANY"):
            creates = may_publish(identity.permissions, f"$JS.API.STREAM.CREATE.{stream}")
            assert creates == (identity.name == ADMIN), (identity.name, stream)
            updates = may_publish(identity.permissions, f"$JS.API.STREAM.UPDATE.{stream}")
            assert updates == (identity.name == ADMIN), (identity.name, stream)
        for durable, owner in DURABLES.items():
            nexts = may_publish(
                identity.permissions, f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{durable}"
            )
            assert nexts == (identity.name in (owner, ADMIN)), identity.name
            deletes = may_publish(
                identity.permissions, f"$JS.API.CONSUMER.DELETE.{STREAM}.{durable}"
            )
            assert deletes == (identity.name in (owner, ADMIN)), identity.name
            makes = may_publish(
                identity.permissions, f"$JS.API.CONSUMER.DURABLE.CREATE.{STREAM}.{durable}"
            )
            assert makes == (identity.name == ADMIN), identity.name


def test_webhook_delivery_is_its_own_identity_and_the_gateway_lost_its_rights() -> None:
    """Issue #36: the webhooks process publishes WebhookDisabled and nothing else, and
    holds the durable consumer `webhooks`; the gateway no longer may do either."""
    by_name = {i.name: i.permissions for i in table()}
    gateway, webhooks = by_name["gateway"], by_name["webhooks"]
    disabled = subject_of("WebhookDisabled")
    assert may_publish(webhooks, disabled)
    assert not may_publish(gateway, disabled)
    for event_type in sorted(set(WRITERS) - {"WebhookDisabled"}):
        assert not may_publish(webhooks, subject_of(event_type)), event_type
    # what it may publish on gpuloom's own subjects: that one event and its dead letters
    assert webhooks.publish is not None
    own = sorted(p for p in webhooks.publish if p.startswith("gpuloom."))
    assert own == ["gpuloom.dlq.webhooks.>", "gpuloom.evt.webhook.*.WebhookDisabled"]
    assert not may_publish(webhooks, "gpuloom.ctl.agent.node-a.logs")
    assert not may_publish(webhooks, "gpuloom.hb.node-a")
    # the gateway still writes the rest of a webhook's life
    for event_type in ("WebhookRegistered", "WebhookDeleted", "WebhookRenewed"):
        assert may_publish(gateway, subject_of(event_type)), event_type
    # the outbox's durable consumer: pulled and acknowledged by webhooks only
    assert DURABLES["webhooks"] == "webhooks"
    for subject in (
        f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.webhooks",
        f"$JS.API.CONSUMER.CREATE.{STREAM}.webhooks",
        f"$JS.ACK.{STREAM}.webhooks.1.2.3.4.5.6",
    ):
        assert may_publish(webhooks, subject), subject
        assert not may_publish(gateway, subject), subject
    assert not may_publish(webhooks, f"$JS.ACK.{STREAM}.accounting-ledger.1.2.3.4.5.6")


def test_the_retired_ledger_durable_is_the_one_in_the_table() -> None:
    from services.accounting.ledger import RETIRED_DURABLE

    assert DURABLES[RETIRED_DURABLE] == "accounting"


def test_each_identity_subscribes_to_its_own_inbox_only() -> None:
    for identity in table():
        if identity.name == ADMIN:
            continue
        inboxes = [s for s in identity.permissions.subscribe or () if s.startswith("_INBOX")]
        assert inboxes == [f"_INBOX.{identity.public_key}.>"], identity.name


@pytest.mark.parametrize("node", [">", "*", "a.b", "", "node a"])
def test_a_node_name_that_is_not_a_token_gets_no_permission(node: str) -> None:
    with pytest.raises(ValueError):
        agent_permissions([node], "UKEY", STREAM)


def test_a_node_cannot_have_two_agents_and_unknown_identities_get_nothing() -> None:
    with pytest.raises(ValueError, match="served by both"):
        nodes_served({"agent-a": ["n1"], "agent-b": ["n1"]})
    with pytest.raises(ValueError, match="no role"):
        identities({"stranger": "UKEY"}, {}, STREAM)


def test_wildcard_matching_follows_nats() -> None:
    assert subject_matches_pattern("a.*.c", "a.b.c")
    assert not subject_matches_pattern("a.*.c", "a.b.c.d")
    assert subject_matches_pattern("a.>", "a.b.c")
    assert not subject_matches_pattern("a.>", "a")
    assert event_permission("JobStarted", "n1") == "gpuloom.evt.job.*.JobStarted.n1"


def test_the_keyring_makes_private_seeds_once_and_the_config_holds_public_keys_only(
    tmp_path: Path,
) -> None:
    keyring = Keyring(tmp_path / "bus")
    keyring.add_agent("agent-x", ["node-x"])
    found = keyring.identities(STREAM)
    again = Keyring(tmp_path / "bus").identities(STREAM)
    assert [(i.name, i.public_key) for i in found] == [(i.name, i.public_key) for i in again]
    assert stat.S_IMODE(os.stat(tmp_path / "bus").st_mode) == 0o700
    seeds = sorted((tmp_path / "bus").glob("*.seed"))
    assert len(seeds) == len(SERVICES) + 3  # reader, admin, agent-x
    for seed in seeds:
        assert stat.S_IMODE(seed.stat().st_mode) == 0o600
    text = users_config(found, "pw")
    for seed in seeds:
        assert seed.read_text().strip() not in text
    users = json.loads(text.split("authorization: ", 1)[1])["users"]
    assert {u.get("nkey") for u in users} >= {i.public_key for i in found}
    with pytest.raises(ValueError, match="served by both"):
        keyring.add_agent("agent-y", ["node-x"])


# --- the subject binds the body ---------------------------------------------------


def wire(event: object) -> bytes:
    envelope = make_envelope(event, at=T0, by="test")  # type: ignore[arg-type]
    return encode(envelope)


def test_agents_events_carry_their_node_and_a_job_subject_covers_them() -> None:
    started = JobStarted(job_id="j1", attempt=1, node="node-a")
    assert subject_for(started) == "gpuloom.evt.job.j1.JobStarted.node-a"
    pattern = job_subjects("j1")
    assert subject_matches_pattern(pattern, subject_for(started))
    assert subject_matches_pattern(pattern, "gpuloom.evt.job.j1.JobQueued")


@pytest.mark.parametrize("cls", ALL_EVENT_CLASSES, ids=lambda c: c.TYPE)
def test_every_event_decodes_on_its_own_subject(cls: type) -> None:
    event = EXAMPLES[cls]
    assert decode(1, wire(event), subject=subject_for(event)).event == event


def test_a_body_that_disagrees_with_its_subject_is_malformed() -> None:
    placed = EXAMPLES[JobPlaced]
    assert isinstance(placed, JobPlaced)
    submitted = JobSubmitted(job_id="j1", spec=make_job_spec(gpus=1))
    for subject in (
        f"gpuloom.evt.job.{placed.job_id}.JobSubmitted",  # type differs
        subject_for(placed).replace(".job.", ".node."),  # aggregate differs
        subject_for(placed).replace(f".{placed.job_id}.", ".other-job."),  # id differs
    ):
        with pytest.raises(MalformedEvent, match="does not match its subject"):
            decode(7, wire(placed), subject=subject)
    started = JobStarted(job_id="j1", attempt=1, node="node-a")
    with pytest.raises(MalformedEvent):  # another node's subject
        decode(7, wire(started), subject="gpuloom.evt.job.j1.JobStarted.node-b")
    # logs from before the node token: still read
    for old in (started, JobFinished(job_id="j1", attempt=1, node="n", outcome="succeeded")):
        legacy = f"gpuloom.evt.job.j1.{old.TYPE}"
        assert decode(7, wire(old), subject=legacy).event == old
    with pytest.raises(MalformedEvent):  # but no other type on a 5-token subject
        decode(7, wire(submitted), subject="gpuloom.evt.job.j1.JobSubmitted.node-a")


def test_an_agents_event_for_a_job_placed_elsewhere_is_voided_by_the_fold() -> None:
    """The server lets agent-b write on node-b's subject: the fold is what refuses a
    JobStarted from node-b for a job placed on node-a."""
    log = LogBuilder()
    log.register("node-a", 2, "A100-80GB")
    log.register("node-b", 2, "A100-80GB")
    log.run_to_queue("j1", gpus=1)
    log.place("j1", "node-a", [0])
    state = log.state()
    forged = JobStarted(job_id="j1", attempt=1, node="node-b")
    recorded = decode(len(log) + 1, wire(forged), subject=subject_for(forged))
    before = state.voided
    apply(state, Recorded(recorded.seq, recorded.envelope, recorded.event))
    assert state.voided == before + 1
    assert "not hosted on node-b" in state.recent_voided[-1].reason
    assert state.jobs["j1"].phase == "placed"
