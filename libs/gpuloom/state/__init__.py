"""Pure fold of the log into the cluster state. Imports nothing of the outside world."""

from gpuloom.state.fold import apply, fold, registration_conflict
from gpuloom.state.model import (
    FINAL_PHASES,
    ON_NODE_PHASES,
    PENDING_PHASES,
    ClusterState,
    GpuState,
    JobPhase,
    JobState,
    NodeState,
    Run,
    Voided,
)

__all__ = [
    "FINAL_PHASES",
    "ON_NODE_PHASES",
    "PENDING_PHASES",
    "ClusterState",
    "GpuState",
    "JobPhase",
    "JobState",
    "NodeState",
    "Run",
    "Voided",
    "apply",
    "fold",
    "registration_conflict",
]
