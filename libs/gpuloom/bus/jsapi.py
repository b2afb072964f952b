"""The JetStream API subjects each kind of bus client calls, and the names they call them
on (snapshot buckets, durable consumers): what `gpuloom.bus.identities` grants.

nats-server permissions are subject patterns, and every JetStream call is a request on
a `$JS.API...` subject that names the stream, the consumer and (for a filtered
consumer) the filter. So "may read the log but not pull the ledger's consumer" or "may
write its own snapshots, not another service's" is a list of those subjects. Pure: no
NATS here.
"""

from __future__ import annotations

import re

#: Durable consumers on the log (name -> owner). Every process follows the log with
#: ephemeral consumers of its own (`gpuloom.bus.follower`). `accounting-ledger` is the
#: ledger's of versions before 2026-12-05 (`services.accounting.ledger.RETIRED_DURABLE`,
#: a test checks it): its owner deletes it. `webhooks` is the webhooks process's outbox
#: (`services.webhooks.outbox`): it makes it, pulls and acknowledges. Every other
#: identity, the gateway included, is denied each of them (`others_durables`).
DURABLES = {"accounting-ledger": "accounting", "webhooks": "webhooks"}


def dead_letter_subjects(service: str) -> str:
    return f"gpuloom.dlq.{service}.>"


def read_api(stream: str) -> list[str]:
    """The JetStream calls every reader of `stream` makes: stream info, its own consumers
    (ordered push ones, flow-controlled; the pull ones that follow the log, asked for
    their next messages and deleted: `gpuloom.bus.follower`), consumer info, and getting
    one message. Other services' durable consumers are denied (`others_durables`)."""
    api = "$JS.API"
    return [
        f"{api}.INFO",
        f"{api}.STREAM.INFO.{stream}",
        f"{api}.CONSUMER.CREATE.{stream}",
        f"{api}.CONSUMER.CREATE.{stream}.>",
        f"{api}.CONSUMER.INFO.{stream}.*",
        f"{api}.CONSUMER.MSG.NEXT.{stream}.*",
        f"{api}.CONSUMER.DELETE.{stream}.*",
        f"{api}.STREAM.MSG.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}.>",
        f"$JS.FC.{stream}.>",
    ]


def writer_api(stream: str, service: str) -> list[str]:
    """What a writer adds: its dead letters (and reading back its last one)."""
    dlq = f"{stream}_DLQ"
    return [
        dead_letter_subjects(service),
        f"$JS.API.STREAM.INFO.{dlq}",
        f"$JS.API.STREAM.MSG.GET.{dlq}",
        f"$JS.API.DIRECT.GET.{dlq}",
    ]


#: A service's snapshot bucket is this and its name (`gpuloom.bus.snapshots`).
SNAPSHOT_BUCKET_PREFIX = "GPULOOM_SNAP_"


def bucket_of(service: str) -> str:
    """The bucket of `service`'s snapshots (a bucket name is `[A-Za-z0-9_-]+`)."""
    if not re.fullmatch(r"[a-z][a-z0-9-]*", service):
        raise ValueError(f"not a service name: {service!r}")
    return SNAPSHOT_BUCKET_PREFIX + service.upper().replace("-", "_")


#: The base snapshots, written by the operator when the log's start is dropped
#: (`gpuloom archive drop`): every process may read them, none may write them.
BASE_BUCKET = f"{SNAPSHOT_BUCKET_PREFIX}BASE"


def _bucket_read_api(bucket: str) -> list[str]:
    """Reading an object store bucket: stream info, getting messages, ordered consumers
    (nats-py finds the bucket's stream by subject: STREAM.NAMES)."""
    stream = f"OBJ_{bucket}"
    api = "$JS.API"
    return [
        f"{api}.STREAM.NAMES",
        f"{api}.STREAM.INFO.{stream}",
        f"{api}.STREAM.MSG.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}.>",
        f"{api}.CONSUMER.CREATE.{stream}",
        f"{api}.CONSUMER.CREATE.{stream}.>",
        f"{api}.CONSUMER.INFO.{stream}.*",
        f"{api}.CONSUMER.DELETE.{stream}.*",
        f"$JS.FC.{stream}.>",
    ]


def base_snapshot_api() -> list[str]:
    """Reading the base snapshots, and nothing more."""
    return _bucket_read_api(BASE_BUCKET)


def snapshot_api(service: str) -> list[str]:
    """A service's own snapshot bucket (`gpuloom.bus.snapshots`, by its name): write and
    delete objects, list and read them back. No other bucket, and no creating one: the admin creates them at setup, since
    a create call carries a configuration no permission can restrict
    (`gpuloom.bus.provision`)."""
    bucket = bucket_of(service)
    stream = f"OBJ_{bucket}"
    writes = [f"$O.{bucket}.>", f"$JS.API.STREAM.PURGE.{stream}"]
    return writes + _bucket_read_api(bucket)


def _durable_api(stream: str, durable: str) -> list[str]:
    api = "$JS.API.CONSUMER"
    return [
        f"{api}.DURABLE.CREATE.{stream}.{durable}",
        f"{api}.CREATE.{stream}.{durable}",
        f"{api}.CREATE.{stream}.{durable}.>",
        f"{api}.DELETE.{stream}.{durable}",
        f"{api}.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
    ]


def others_durables(stream: str, owner: str | None) -> tuple[str, ...]:
    """The durable consumers of services other than `owner`: creating (or updating)
    them, pulling from them and deleting them (a reader that pulled the ledger's
    messages would hold its charges back until they are redelivered)."""
    return tuple(
        subject
        for durable, service in DURABLES.items()
        if service != owner
        for subject in _durable_api(stream, durable)
        if not subject.startswith("$JS.ACK.")
    )


def own_durables(stream: str, owner: str) -> list[str]:
    """Acknowledging the messages of `owner`'s durable consumers (the rest of their API
    is `read_api`'s; the legacy DURABLE.CREATE stays the admin's)."""
    return [f"$JS.ACK.{stream}.{d}.>" for d, service in DURABLES.items() if service == owner]
