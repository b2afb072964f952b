"""Audit: re-make every recorded placement decision and compare it with the log.

A placement cycle writes JobPlaced, JobPreempted and JobReserved events (and JobGrown
and JobShrunk for elastic gangs). Each
records the sequence its state was folded to (`basis_seq`), its
position in its cycle and its policy. Placement is a pure function of that
state, so folding the log to `basis_seq` and running the cycle again with the
named policy must give, at that position, exactly the recorded decision. A
decision that was edited, forged or made by different code does not.

The log is folded once, in order; when the fold reaches a basis that some
recorded decisions name, the cycle is re-run there, once for all of them.

The fold may start from a snapshot instead of sequence 1 (`start`, the state at its
`seq`; `records` then hold what follows): an audit of the recent decisions without
folding years of history. A decision whose basis is before the start cannot be
re-made from it (its state is gone) and is counted apart, never passed.

Snapshots to prove (`snapshots`) are checked in the same pass: as the fold passes
each one's sequence S, the folded state must equal it (`gpuloom.audit.proofs`). One
that differs is a mismatch like a decision that differs; one that cannot be decoded
is reported as skipped, as services skip it.

With `workers` above 1 the points to check (the cycles' bases and the snapshots'
sequences) are cut into contiguous runs of about equal decisions, each checked by a
process of its own, forked where the fold reaches its run (`gpuloom.audit.workers`). Each
decision depends only on the log up to its basis, so the report is the same, in the
same order, as from one process.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpuloom.audit.proofs import SnapshotCheck, SnapshotClaim, check_claim
from gpuloom.audit.workers import can_fork, collector_paused, run_parts
from gpuloom.events import JobGrown, JobPlaced, JobPreempted, JobReserved, JobShrunk, Recorded
from gpuloom.placement.cycle import placement_cycle
from gpuloom.placement.incremental.index_cache import IndexCache
from gpuloom.placement.registry import PolicyRegistry, default_registry
from gpuloom.state import ClusterState
from gpuloom.state.changes import ChangeFeed

#: The events a placement cycle writes; each is compared field by field.
CycleEvent = JobPlaced | JobPreempted | JobReserved | JobGrown | JobShrunk
CYCLE_EVENTS = (JobPlaced, JobPreempted, JobReserved, JobGrown, JobShrunk)


@dataclass
class AuditReport:
    from_seq: int
    to_seq: int
    verified: int = 0
    mismatches: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: The sequence the fold started from (0: from the first event).
    start_seq: int = 0
    #: Decisions after the start whose basis is before it: not re-made, not passed.
    before_start: int = 0
    #: What became of each snapshot given to prove, in the order the fold met them.
    snapshots: list[SnapshotCheck] = field(default_factory=list)
    #: The processes that re-made the decisions (`audit`'s `workers`, or fewer).
    workers: int = 1

    @property
    def proved(self) -> list[SnapshotCheck]:
        return [check for check in self.snapshots if check.outcome == "proved"]

    @property
    def skipped(self) -> list[SnapshotCheck]:
        return [check for check in self.snapshots if check.outcome == "skipped"]

    @property
    def ok(self) -> bool:
        return not self.mismatches


def _differences(recorded: CycleEvent, remade: CycleEvent | None) -> str | None:
    if remade is None:
        return "the policy makes no decision at this position"
    if type(remade) is not type(recorded):
        return f"recorded a {recorded.TYPE}, the cycle makes a {remade.TYPE} here"
    if remade == recorded:  # field by field, as validated: the common case, without dumps
        return None
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
    *,
    start: ClusterState | None = None,
    snapshots: Sequence[SnapshotClaim] = (),
    workers: int = 1,
) -> AuditReport:
    """Verify every cycle event (JobPlaced, JobPreempted, JobReserved, JobGrown, JobShrunk) at or after
    `from_seq` in `records` (the log in order: all of it, or what follows `start`), and
    prove `snapshots` on the way.

    `start`: the state the fold starts from (a trusted snapshot's, folded on in place,
    so not to be used afterwards; default: empty, the log from sequence 1). Records at
    or before its `seq` are ignored. A snapshot before the start or past the last
    record is skipped. `workers`: at most this many processes share the work (one
    where this process cannot fork, `gpuloom.audit.workers.can_fork`).
    """
    started = time.perf_counter()
    registry = registry or default_registry()
    state = start if start is not None else ClusterState()
    begin = state.seq
    if begin:
        records = [record for record in records if record.seq > begin]
    last = records[-1].seq if records else begin
    report = AuditReport(max(from_seq, begin + 1) if begin else from_seq, last, start_seq=begin)
    by_basis: dict[int, list[Recorded]] = defaultdict(list)
    for record in records:
        if isinstance(record.event, CYCLE_EVENTS) and record.seq >= from_seq:
            if record.event.basis_seq < begin:
                report.before_start += 1
            else:
                by_basis[record.event.basis_seq].append(record)
    claims: dict[int, list[SnapshotClaim]] = defaultdict(list)
    for claim in snapshots:
        if claim.seq < begin:
            report.snapshots.append(
                SnapshotCheck.of(claim, "skipped", f"before the start of this audit (seq {begin})")
            )
        elif claim.seq > last:
            report.snapshots.append(
                SnapshotCheck.of(claim, "skipped", f"past the end of the log read (seq {last})")
            )
        else:
            claims[claim.seq].append(claim)
    points = sorted(set(by_basis) | set(claims))
    parts = runs_of_points(points, by_basis, workers if can_fork() else 1)

    fold = LogFold(records, state)

    def check(part: list[int]) -> Findings:
        return _check_points(fold, part, by_basis, claims, registry)

    def prepare(part: list[int]) -> None:
        if part:
            fold.to(part[0])

    with collector_paused():
        results = run_parts(parts, check, prepare)
    for found in results:
        report.verified += found.verified
        report.mismatches += found.mismatches
        report.snapshots += found.snapshots
    report.workers = len(parts)
    report.seconds = time.perf_counter() - started
    return report


@dataclass
class Findings:
    """What checking some points found; a forked worker sends it back pickled."""

    verified: int = 0
    mismatches: list[str] = field(default_factory=list)
    snapshots: list[SnapshotCheck] = field(default_factory=list)


def runs_of_points(
    points: list[int], by_basis: Mapping[int, list[Recorded]], workers: int
) -> list[list[int]]:
    """`points` (sorted) cut into at most `workers` contiguous runs, each about an equal
    share of the work; never an empty run, except the one run of no points.

    A point's work is its decisions, plus the decisions of the point before it, plus one:
    re-making a cycle also re-scores, for each request shape asked again, the nodes the
    cycle before it changed (about one per decision). A cycle of few decisions after a
    big one costs about as much as a big one (docs/benchmarks.md, the audit on both cores).
    """
    decisions = [len(by_basis.get(point, ())) for point in points]
    before = [0, *decisions][: len(decisions)]
    weights = [count + earlier + 1 for count, earlier in zip(decisions, before, strict=True)]
    total = sum(weights)
    runs: list[list[int]] = [[]]
    done = 0
    for point, weight in zip(points, weights, strict=True):
        # cut before this point when taking it would overshoot this run's share more
        # than stopping short of it does
        if runs[-1] and len(runs) < workers and 2 * done + weight > 2 * total * len(runs) / workers:
            runs.append([])
        runs[-1].append(point)
        done += weight
    return runs


class LogFold:
    """`records` folded onto `state`, forward only, up to the point last asked for."""

    def __init__(self, records: Sequence[Recorded], state: ClusterState) -> None:
        self.records = records
        self.state = state
        self.position = 0  # records[:position] are folded
        #: What each folded event changed, for the kept node indexes (`IndexCache`).
        self.changes = ChangeFeed()

    def to(self, point: int) -> ClusterState:
        records, state, position = self.records, self.state, self.position
        while position < len(records) and records[position].seq <= point:
            self.changes.apply(state, records[position])
            position += 1
        self.position = position
        # entries the reactors skipped as malformed still advanced their state's seq
        state.seq = max(state.seq, point)
        return state


def _check_points(
    fold: LogFold,
    points: list[int],
    by_basis: Mapping[int, list[Recorded]],
    claims: Mapping[int, list[SnapshotClaim]],
    registry: PolicyRegistry,
) -> Findings:
    """Fold on up to each point in turn, re-make the decisions based there and prove
    the snapshots taken there."""
    found = Findings()
    kept: dict[tuple[str, int], IndexCache] = {}  # each policy's node index, cycle to cycle
    for point in points:
        state = fold.to(point)
        if point in by_basis:
            _verify_cycle(state, by_basis[point], registry, found, kept, fold.changes)
        for claim in sorted(claims.get(point, ()), key=lambda c: c.bucket):
            check = check_claim(state, claim)
            found.snapshots.append(check)
            if check.outcome == "differs":
                found.mismatches.append(check.line())
    return found


def _verify_cycle(
    state: ClusterState,
    decisions: list[Recorded],
    registry: PolicyRegistry,
    found: Findings,
    kept: dict[tuple[str, int], IndexCache],
    changes: ChangeFeed,
) -> None:
    remade_by_policy: dict[tuple[str, int], list[CycleEvent]] = {}
    for record in decisions:
        event = record.event
        assert isinstance(event, CYCLE_EVENTS)
        where = f"seq {record.seq} (job {event.job_id}, basis {event.basis_seq})"
        try:
            policy = registry.get(event.policy.name, event.policy.version)
        except KeyError as exc:
            found.mismatches.append(f"{where}: {exc.args[0]}")
            continue
        if policy.version != event.policy.version or dict(policy.params) != event.policy.params:
            found.mismatches.append(
                f"{where}: recorded {event.policy.name} v{event.policy.version} "
                f"{event.policy.params}, this gpuloom has v{policy.version} {dict(policy.params)}"
            )
            continue
        key = (policy.name, policy.version)
        if key not in remade_by_policy:
            remade_by_policy[key] = [
                d.event
                for d in placement_cycle(
                    state, policy, kept=kept.setdefault(key, IndexCache(changes))
                )
                if isinstance(d.event, CYCLE_EVENTS)
            ]
        remade = remade_by_policy[key]
        position = event.cycle_position
        problem = _differences(event, remade[position] if position < len(remade) else None)
        if problem is None:
            found.verified += 1
        else:
            found.mismatches.append(f"{where}: {problem}")
