"""The one table of event types: name -> class. Explicit, no registration by import."""

from __future__ import annotations

from gpuloom.events.accounting import UsageCharged
from gpuloom.events.accounts import (
    AccountCoordinatorsSet,
    AccountCreated,
    AccountUsersSet,
    QuotaSet,
    SharesSet,
)
from gpuloom.events.admission import JobAdmitted, JobRejected
from gpuloom.events.agent import JobFinished, JobStarted
from gpuloom.events.audit import AuditCompleted
from gpuloom.events.base import Event
from gpuloom.events.gateway import JobArraySubmitted, JobCancelRequested, JobSubmitted
from gpuloom.events.health import GpuHealthy, GpuUnhealthy
from gpuloom.events.inventory import (
    GpuPoolChanged,
    NodeCordoned,
    NodeLost,
    NodeRecovered,
    NodeRegistered,
    NodeRemoved,
    NodeUncordoned,
)
from gpuloom.events.placement import JobGrown, JobPlaced, JobPreempted, JobReserved, JobShrunk
from gpuloom.events.policies import LimitsSet, PriorityClassDeleted, PriorityClassSet
from gpuloom.events.queue import JobCancelled, JobQueued, QueuePolicySet
from gpuloom.events.reservations import (
    ReservationCreated,
    ReservationDeleted,
    ReservationEnded,
    ReservationStarted,
    ReservationUpdated,
)
from gpuloom.events.webhooks import (
    WebhookDeleted,
    WebhookDisabled,
    WebhookRegistered,
    WebhookRenewed,
)

ALL_EVENT_CLASSES: tuple[type[Event], ...] = (
    JobSubmitted,
    JobCancelRequested,
    JobAdmitted,
    JobRejected,
    JobQueued,
    JobCancelled,
    JobPlaced,
    JobStarted,
    JobFinished,
    UsageCharged,
    NodeRegistered,
    NodeLost,
    NodeRecovered,
    GpuPoolChanged,
    AuditCompleted,
    QueuePolicySet,
    AccountCreated,
    SharesSet,
    QuotaSet,
    JobReserved,
    JobPreempted,
    NodeCordoned,
    NodeRemoved,
    NodeUncordoned,
    AccountUsersSet,
    JobArraySubmitted,
    AccountCoordinatorsSet,
    PriorityClassSet,
    ReservationCreated,
    ReservationUpdated,
    ReservationDeleted,
    ReservationStarted,
    ReservationEnded,
    PriorityClassDeleted,
    LimitsSet,
    WebhookRegistered,
    WebhookDeleted,
    WebhookDisabled,
    WebhookRenewed,
    GpuUnhealthy,
    GpuHealthy,
    JobGrown,
    JobShrunk,
)


def _build_registry() -> dict[str, type[Event]]:
    registry: dict[str, type[Event]] = {}
    for cls in ALL_EVENT_CLASSES:
        if cls.TYPE in registry:
            raise ValueError(f"duplicate event type {cls.TYPE}")
        registry[cls.TYPE] = cls
    return registry


EVENT_TYPES: dict[str, type[Event]] = _build_registry()


def json_schemas() -> dict[str, object]:
    """JSON Schema of every event payload, keyed by type, with its current version."""
    return {
        name: {"v": cls.VERSION, "aggregate": cls.AGGREGATE, "schema": cls.model_json_schema()}
        for name, cls in sorted(EVENT_TYPES.items())
    }
