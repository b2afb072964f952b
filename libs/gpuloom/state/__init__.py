"""Pure fold of the log into the cluster state. Imports nothing of the outside world."""

from gpuloom.state.fold import Folded, apply, fold
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
from gpuloom.state.rules.nodes import registration_conflict

__all__ = [
    "FINAL_PHASES",
    "ON_NODE_PHASES",
    "PENDING_PHASES",
    "ClusterState",
    "Folded",
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
