"""Audit and replay: every placement decision re-made from the log, any past state rebuilt."""

from gpuloom.audit.replay import Snapshot, snapshot, state_at
from gpuloom.audit.verify import AuditReport, audit

__all__ = ["AuditReport", "Snapshot", "audit", "snapshot", "state_at"]
