"""SQL read models (projections) of the log. Rebuildable at will: the log is the truth.

Every projected row carries the stream sequence of the last event that changed
it (`last_seq`), and an upsert only replaces a row with a newer one, so two
writers folding the same log (two gateway replicas, a rebuild racing a live
projector) converge on the same rows. `projection_checkpoints` holds each
projection's position, written in the same transaction as its rows.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite drops the zone otherwise)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime, dict[str, Any]: JSON, list[Any]: JSON}


class ProjectionCheckpoint(Base):
    __tablename__ = "projection_checkpoints"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    last_seq: Mapped[int] = mapped_column(BigInteger)


class ProjectionQuarantine(Base):
    """Rows a projection's database refused: kept, escaped, so the projection goes on.

    One entry per projection and aggregate (`kind` job, node or charge; `key` its
    id, escaped): a newer refusal replaces it, a later write that goes in removes it.
    """

    __tablename__ = "projection_quarantine"

    projection: Mapped[str] = mapped_column(String(100), primary_key=True)
    kind: Mapped[str] = mapped_column(String(20), primary_key=True)
    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    #: Stream sequence of the event that last changed the refused row.
    seq: Mapped[int] = mapped_column(BigInteger)
    error: Mapped[str] = mapped_column(String(1000))
    #: The refused rows as JSON text, by table, with unprintable characters escaped.
    row: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(UTCDateTime)


class JobRow(Base):
    __tablename__ = "jobs"
    #: `GET /v1/jobs` pages in submission order: read in order, never sorted (0009).
    __table_args__ = (Index("ix_jobs_submit_order", "submit_seq", "id"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    user: Mapped[str] = mapped_column(String(100), index=True)
    account: Mapped[str] = mapped_column(String(100), index=True)
    state: Mapped[str] = mapped_column(String(20), index=True)
    reason: Mapped[str | None] = mapped_column(String(2000))
    node: Mapped[str | None] = mapped_column(String(64))
    gpus: Mapped[list[Any]] = mapped_column(JSON)
    gpus_requested: Mapped[int] = mapped_column(Integer)
    gpu_model: Mapped[list[Any]] = mapped_column(JSON)
    priority: Mapped[int] = mapped_column(Integer)
    command: Mapped[list[Any]] = mapped_column(JSON)
    time_limit_s: Mapped[int | None] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    #: Times it was requeued because a GPU failed under it (expedited requeue).
    requeues: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    cancel_requested: Mapped[bool] = mapped_column(Boolean)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), index=True)
    submit_seq: Mapped[int] = mapped_column(BigInteger)
    submitted_at: Mapped[datetime] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_seq: Mapped[int] = mapped_column(BigInteger)
    #: The resource request (fraction, CPU, memory, pool, locality, selector, replicas).
    request: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    #: The current placement: every replica with its slices.
    placement: Mapped[list[Any] | None] = mapped_column(JSON)


class NodeRow(Base):
    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    state: Mapped[str] = mapped_column(String(20))
    simulated: Mapped[bool] = mapped_column(Boolean)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON)
    cpu_milli: Mapped[int] = mapped_column(Integer)
    memory_mib: Mapped[int] = mapped_column(BigInteger)
    #: [{"index", "uuid", "model", "memory_mib", "allocated", "job_id"}] by index.
    gpus: Mapped[list[Any]] = mapped_column(JSON)
    last_seq: Mapped[int] = mapped_column(BigInteger)
    lends_remote_vgpu: Mapped[bool] = mapped_column(Boolean, default=False)
    isolation: Mapped[str] = mapped_column(String(20), default="advisory")
    #: Container runtimes its agent found (["podman"]); None in rows from before them.
    runtimes: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    #: Why an admin cordoned the node (NodeCordoned); None: it takes new work.
    cordoned: Mapped[str | None] = mapped_column(String(500), nullable=True, default=None)
    #: [{"level", "domain"}], tightest level first (`NodeSpec.topology`); None in rows
    #: from before topology.
    topology: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)


class UsageChargeRow(Base):
    """The accounting ledger: one row per charge (a run's interim parts, then its final one)."""

    __tablename__ = "usage_charges"
    __table_args__ = (Index("ix_usage_charges_account_user", "account", "user"),)

    job_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    part: Mapped[int] = mapped_column(Integer, primary_key=True, default=0)
    user: Mapped[str] = mapped_column(String(100))
    account: Mapped[str] = mapped_column(String(100))
    gpus: Mapped[int] = mapped_column(Integer)
    seconds: Mapped[float] = mapped_column(Float)
    gpu_milli_seconds: Mapped[int] = mapped_column(BigInteger)
    charged_at: Mapped[datetime] = mapped_column(UTCDateTime)
    seq: Mapped[int] = mapped_column(BigInteger)


class UsageModelChargeRow(Base):
    """The ledger split by GPU model: one row per charge and model."""

    __tablename__ = "usage_model_charges"
    __table_args__ = (Index("ix_usage_model_charges_model", "gpu_model"),)

    job_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    part: Mapped[int] = mapped_column(Integer, primary_key=True, default=0)
    gpu_model: Mapped[str] = mapped_column(String(100), primary_key=True)
    user: Mapped[str] = mapped_column(String(100))
    account: Mapped[str] = mapped_column(String(100))
    gpu_milli_seconds: Mapped[int] = mapped_column(BigInteger)
    charged_at: Mapped[datetime] = mapped_column(UTCDateTime)
    seq: Mapped[int] = mapped_column(BigInteger)


class WebhookDeliveryRow(Base):
    """One event to deliver to one webhook (the outbox of `services.webhooks`): written
    when the webhooks process's durable consumer takes the event, before it is acked, so
    a restart loses none; then delivered, in sequence order per webhook, until it is
    `delivered`, `failed` (retries spent) or `dropped` (the webhook was disabled)."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_hook_seq", "webhook_id", "seq", unique=True),
        Index("ix_webhook_deliveries_status", "status", "webhook_id"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    webhook_id: Mapped[str] = mapped_column(String(64))
    seq: Mapped[int] = mapped_column(BigInteger)
    #: The event's id: the `webhook-id` header, the same on every attempt.
    event_id: Mapped[str] = mapped_column(String(200))
    event_type: Mapped[str] = mapped_column(String(100))
    #: The CloudEvent JSON sent as the body.
    body: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(20))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_at: Mapped[datetime] = mapped_column(UTCDateTime)
    #: A gateway replica is attempting it until then (the others leave it alone).
    claimed_until: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    done_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class WebhookAttemptRow(Base):
    """One attempt at one delivery, and what the receiver answered."""

    __tablename__ = "webhook_attempts"

    delivery_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    #: The HTTP status, or None when no answer came (refused, timed out).
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(String(500), nullable=True)
    #: The start of the answer's body, for the owner to see why.
    response: Mapped[str | None] = mapped_column(String(1000), nullable=True)
    duration_ms: Mapped[int] = mapped_column(Integer)
