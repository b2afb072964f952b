"""Audit: re-make every recorded placement decision and compare it with the log.

A placement cycle writes JobPlaced, JobPreempted and JobReserved events. Each
records the sequence its state was folded to (`basis_seq`), its
position in its cycle and its policy. Placement is a pure function of that
state, so folding the log to `basis_seq` and running the cycle again with the
named policy must give, at that position, exactly the recorded decision. A
decision that was edited, forged or made by different code does not.

The log is folded once, in order; when the fold reaches a basis that some
recorded decisions name, the cycle is re-run there, once for all of them.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuloom.events import JobPlaced, JobPreempted, JobReserved, Recorded
from gpuloom.placement.cycle import placement_cycle
from gpuloom.placement.registry import PolicyRegistry, default_registry
from gpuloom.state import ClusterState, apply

#: The events a placement cycle writes; each is compared field by field.
CycleEvent = JobPlaced | JobPreempted | JobReserved
CYCLE_EVENTS = (JobPlaced, JobPreempted, JobReserved)


@dataclass
class AuditReport:
    from_seq: int
    to_seq: int
    verified: int = 0
    mismatches: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.mismatches


def _differences(recorded: CycleEvent, remade: CycleEvent | None) -> str | None:
    if remade is None:
        return "the policy makes no decision at this position"
    if type(remade) is not type(recorded):
        return f"recorded a {recorded.TYPE}, the cycle makes a {remade.TYPE} here"
    ours, theirs = recorded.model_dump(mode="json"), remade.model_dump(mode="json")
    fields = [name for name in ours if ours[name] != theirs[name]]
    if not fields:
        return None
    parts = [f"{name}: recorded {ours[name]!r}, re-made {theirs[name]!r}" for name in fields[:3]]
    return "; ".join(parts)


def audit(
    records: Sequence[Recorded],
    registry: PolicyRegistry | None = None,
    from_seq: int = 0,
) -> AuditReport:
    """Verify every cycle event (JobPlaced, JobPreempted, JobReserved) at or after `from_seq` in `records` (the whole log, in order)."""
    started = time.perf_counter()
    registry = registry or default_registry()
    by_basis: dict[int, list[Recorded]] = defaultdict(list)
    for record in records:
        if isinstance(record.event, CYCLE_EVENTS) and record.seq >= from_seq:
            by_basis[record.event.basis_seq].append(record)
    report = AuditReport(from_seq, records[-1].seq if records else 0)
    state = ClusterState()
    pending = sorted(by_basis)
    position = 0
    for basis in pending:
        while position < len(records) and records[position].seq <= basis:
            apply(state, records[position])
            position += 1
        # entries the reactors skipped as malformed still advanced their state's seq
        state.seq = max(state.seq, basis)
        _verify_cycle(state, by_basis[basis], registry, report)
    report.seconds = time.perf_counter() - started
    return report


def _verify_cycle(
    state: ClusterState, decisions: list[Recorded], registry: PolicyRegistry, report: AuditReport
) -> None:
    remade_by_policy: dict[tuple[str, int], list[CycleEvent]] = {}
    for record in decisions:
        event = record.event
        assert isinstance(event, CYCLE_EVENTS)
        where = f"seq {record.seq} (job {event.job_id}, basis {event.basis_seq})"
        try:
            policy = registry.get(event.policy.name)
        except KeyError as exc:
            report.mismatches.append(f"{where}: {exc.args[0]}")
            continue
        if policy.version != event.policy.version or dict(policy.params) != event.policy.params:
            report.mismatches.append(
                f"{where}: recorded {event.policy.name} v{event.policy.version} "
                f"{event.policy.params}, this gpuloom has v{policy.version} {dict(policy.params)}"
            )
            continue
        key = (policy.name, policy.version)
        if key not in remade_by_policy:
            remade_by_policy[key] = [
                d.event for d in placement_cycle(state, policy) if isinstance(d.event, CYCLE_EVENTS)
            ]
        remade = remade_by_policy[key]
        position = event.cycle_position
        problem = _differences(event, remade[position] if position < len(remade) else None)
        if problem is None:
            report.verified += 1
        else:
            report.mismatches.append(f"{where}: {problem}")
