"""Audit and replay: every placement decision re-made from the log, any past state
rebuilt, and the services' snapshots proved to be the fold of the log they claim."""

from gpuloom.audit.difference import first_difference
from gpuloom.audit.proofs import SnapshotCheck, SnapshotClaim, Start, newest_trusted
from gpuloom.audit.replay import Snapshot, snapshot, state_at
from gpuloom.audit.verify import AuditReport, audit

__all__ = [
    "AuditReport",
    "Snapshot",
    "SnapshotCheck",
    "SnapshotClaim",
    "Start",
    "audit",
    "first_difference",
    "newest_trusted",
    "snapshot",
    "state_at",
]
