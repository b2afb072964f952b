"""Snapshots as claims an audit checks: "this state is the fold of the log up to S".

Every service folds every event with the one fold, so a snapshot a service stored at
sequence S must equal `fold(log[:S])`, whichever service wrote it. An audit that
folds the log anyway can check that as it passes S: equal, the snapshot is proved
(and a restart from it decides as a restart from sequence 1 would); unequal, the
snapshot is wrong (a bug in the fold's determinism or in the codec, or a forgery)
and the audit fails, naming it and the first field that differs.

A snapshot that cannot be decoded is not a claim at all: services skip it for an
older one or a full replay (`gpuloom.runtime.snapshots`), so the audit reports it
as skipped with the codec's reason, and does not fail for it.

Pure: bytes in (read by the caller from the buckets), states and checks out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from gpuloom.audit.difference import first_difference
from gpuloom.state import ClusterState
from gpuloom.state.snapshot import SnapshotError, decode_snapshot

Outcome = Literal["proved", "differs", "skipped"]


@dataclass(frozen=True)
class SnapshotClaim:
    """One stored snapshot: its bucket, whose it is, its object name and the sequence
    the name says it was folded to, and its bytes (decoded only when needed: a state
    can be tens of megabytes, the bytes a fiftieth of that)."""

    bucket: str
    #: Who wrote it, as said in reports: "placement", "agent (GPULOOM_SNAP_AGENT_...)".
    source: str
    name: str
    seq: int
    data: bytes = field(repr=False)

    @property
    def label(self) -> str:
        return f"snapshot {self.name} of {self.source}"


@dataclass(frozen=True)
class SnapshotCheck:
    """What an audit found of one snapshot: proved, differs (`detail`: the first
    difference) or skipped (`detail`: why it was not compared)."""

    bucket: str
    source: str
    name: str
    seq: int
    outcome: Outcome
    detail: str = ""

    @classmethod
    def of(cls, claim: SnapshotClaim, outcome: Outcome, detail: str = "") -> SnapshotCheck:
        return cls(claim.bucket, claim.source, claim.name, claim.seq, outcome, detail)

    @property
    def label(self) -> str:
        return f"snapshot {self.name} of {self.source}"

    def line(self) -> str:
        """One line for a report (and, for `differs`, the audit's mismatch)."""
        if self.outcome == "proved":
            return f"{self.label} is the fold of the log up to seq {self.seq}"
        if self.outcome == "differs":
            return (
                f"{self.label} is not the fold of the log up to seq {self.seq}: "
                f"first difference in {self.detail}"
            )
        return f"{self.label} skipped: {self.detail}"

    def as_json(self) -> dict[str, object]:
        return {
            "bucket": self.bucket,
            "source": self.source,
            "name": self.name,
            "seq": self.seq,
            "outcome": self.outcome,
            "detail": self.detail,
        }


def trusted_state(claim: SnapshotClaim) -> ClusterState:
    """The state `claim` holds, or SnapshotError: the codec's checks, and the state's
    sequence against the object's name (as a service checks before it starts from it)."""
    state = decode_snapshot(claim.data)
    if state.seq != claim.seq:
        raise SnapshotError(f"it holds the state at seq {state.seq}")
    return state


def check_claim(state: ClusterState, claim: SnapshotClaim) -> SnapshotCheck:
    """Compare `claim` with `state`, the fold of the log up to `claim.seq`."""
    try:
        claimed = trusted_state(claim)
    except SnapshotError as exc:
        return SnapshotCheck.of(claim, "skipped", str(exc))
    if claimed == state:
        return SnapshotCheck.of(claim, "proved")
    difference = first_difference(state, claimed) or "the state (no field found)"
    return SnapshotCheck.of(claim, "differs", difference)


@dataclass(frozen=True)
class Start:
    """A snapshot to fold on from, and its state (folded on in place by its user)."""

    claim: SnapshotClaim
    state: ClusterState


def newest_trusted(
    claims: Sequence[SnapshotClaim], seq: int | None = None, at: datetime | None = None
) -> tuple[Start | None, list[SnapshotCheck]]:
    """The newest snapshot that decodes, not past `seq` and whose log clock is not past
    `at`, of any service (they all hold the same fold); and those skipped as untrusted
    on the way (newer ones that are merely past `seq` or `at` are not reported).

    For `at`: the state's clock is the latest time folded, so every event it applied
    was written at or before `at`. A replay from sequence 1 stops at the first event
    written after `at`; the two differ only if an event before the snapshot was voided
    or had its time bounded (`MAX_CLOCK_SKEW`) and was written after `at`.
    """
    skipped: list[SnapshotCheck] = []
    for claim in sorted(claims, key=lambda c: (-c.seq, c.bucket)):
        if seq is not None and claim.seq > seq:
            continue
        try:
            state = trusted_state(claim)
        except SnapshotError as exc:
            skipped.append(SnapshotCheck.of(claim, "skipped", str(exc)))
            continue
        if at is not None and state.clock is not None and state.clock > at:
            continue
        return Start(claim, state), skipped
    return None, skipped
