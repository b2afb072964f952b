"""THE wire contract of gpuloom: the envelope, every event type, subjects, upcasters.

Import event classes from here; never copy one into a service.
"""

from gpuloom.events.accounting import UsageCharged
from gpuloom.events.accounts import (
    AccountCoordinatorsSet,
    AccountCreated,
    AccountUsersSet,
    QuotaSet,
    SharesSet,
)
from gpuloom.events.admission import JobAdmitted, JobRejected
from gpuloom.events.agent import JobFinished, JobStarted, Outcome
from gpuloom.events.audit import AuditCompleted
from gpuloom.events.base import Envelope, Event, JobEvent, NodeEvent
from gpuloom.events.codec import MalformedEvent, Recorded, decode, encode, make_envelope
from gpuloom.events.decision import Decision
from gpuloom.events.gateway import (
    JobArraySubmitted,
    JobCancelRequested,
    JobSubmitted,
    array_task_id,
)
from gpuloom.events.health import GpuHealthy, GpuUnhealthy, HealthCheck
from gpuloom.events.inventory import (
    GpuPoolChanged,
    GpuSpec,
    NodeCordoned,
    NodeLost,
    NodeRecovered,
    NodeRegistered,
    NodeRemoved,
    NodeSpec,
    NodeUncordoned,
    TopologyPlace,
)
from gpuloom.events.jobs import Dependency, JobSpec
from gpuloom.events.placement import (
    REPLICA_NUMBERS_PER_REPLICA,
    JobGrown,
    JobPlaced,
    JobPreempted,
    JobReserved,
    JobShrunk,
    PolicyRef,
    ReplicaAssignment,
    SliceRef,
)
from gpuloom.events.policies import LimitsSet, PriorityClassDeleted, PriorityClassSet
from gpuloom.events.queue import JobCancelled, JobQueued, QueuePolicySet
from gpuloom.events.registry import ALL_EVENT_CLASSES, EVENT_TYPES, json_schemas
from gpuloom.events.reservations import (
    ReservationCreated,
    ReservationDeleted,
    ReservationEnded,
    ReservationSpec,
    ReservationStarted,
    ReservationUpdated,
    ReservedGpu,
)
from gpuloom.events.subjects import subject_for
from gpuloom.events.webhooks import (
    WebhookDeleted,
    WebhookDisabled,
    WebhookRegistered,
    WebhookRenewed,
)

__all__ = [
    "ALL_EVENT_CLASSES",
    "EVENT_TYPES",
    "REPLICA_NUMBERS_PER_REPLICA",
    "AccountCoordinatorsSet",
    "AccountCreated",
    "AccountUsersSet",
    "AuditCompleted",
    "Decision",
    "Dependency",
    "Envelope",
    "Event",
    "GpuHealthy",
    "GpuPoolChanged",
    "GpuSpec",
    "GpuUnhealthy",
    "HealthCheck",
    "JobAdmitted",
    "JobArraySubmitted",
    "JobCancelRequested",
    "JobCancelled",
    "JobEvent",
    "JobFinished",
    "JobGrown",
    "JobPlaced",
    "JobPreempted",
    "JobQueued",
    "JobRejected",
    "JobReserved",
    "JobShrunk",
    "JobSpec",
    "JobStarted",
    "JobSubmitted",
    "LimitsSet",
    "MalformedEvent",
    "NodeCordoned",
    "NodeEvent",
    "NodeLost",
    "NodeRecovered",
    "NodeRegistered",
    "NodeRemoved",
    "NodeSpec",
    "NodeUncordoned",
    "Outcome",
    "PolicyRef",
    "PriorityClassDeleted",
    "PriorityClassSet",
    "QueuePolicySet",
    "QuotaSet",
    "Recorded",
    "ReplicaAssignment",
    "ReservationCreated",
    "ReservationDeleted",
    "ReservationEnded",
    "ReservationSpec",
    "ReservationStarted",
    "ReservationUpdated",
    "ReservedGpu",
    "SharesSet",
    "SliceRef",
    "TopologyPlace",
    "UsageCharged",
    "WebhookDeleted",
    "WebhookDisabled",
    "WebhookRegistered",
    "WebhookRenewed",
    "array_task_id",
    "decode",
    "encode",
    "json_schemas",
    "make_envelope",
    "subject_for",
]
