"""Golden logs: logs made once by the real stack of their day, kept in tests/golden/,
that every later version must still read, fold to the same figures and audit.

A golden log is an archive (`gpuloom.bus.archive`: segments with their sha256) and
`expected.json`, what the fold and the audit of the day said of it (`expected_of`).
tests/golden/make_golden_log.py makes one; tests/unit/state/test_golden_log.py holds
every one of them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuloom.audit import audit
from gpuloom.bus.archive import read_archive
from gpuloom.events import Recorded, decode
from gpuloom.state import ClusterState, apply


def read_golden(root: Path) -> list[Recorded]:
    """Every event of the archive in `root`, decoded as a reactor decodes the stream
    (the body checked against its subject); a malformed one raises."""
    return [decode(m.seq, m.body, m.stored_at, subject=m.subject) for m in read_archive(root)]


def expected_of(records: Sequence[Recorded]) -> dict[str, Any]:
    """What a version says of a log: its events by type, what the fold voided, the
    state it folds to (jobs by phase, nodes, accounts, classes, limits, usage), and
    how many decisions the audit re-made (and any mismatch)."""
    state = ClusterState()
    voided: list[str] = []
    for record in records:
        before = state.voided
        apply(state, record)
        if state.voided > before:
            voided.append(f"{record.seq} {record.envelope.type}: {state.recent_voided[-1].reason}")
    report = audit(records)
    phases: Counter[str] = Counter(job.phase for job in state.jobs.values())
    phases.update(state.forgotten_by_phase)
    return {
        "events": dict(sorted(Counter(r.envelope.type for r in records).items())),
        "last_seq": records[-1].seq if records else 0,
        "voided": voided,
        "jobs_by_phase": dict(sorted(phases.items())),
        "live_jobs": sorted(state.jobs),
        "tombstones": len(state.tombstones),
        "placements": state.forgotten_attempts + sum(j.attempt for j in state.jobs.values()),
        "nodes": {
            name: {
                "phase": node.phase,
                "cordoned": node.cordoned,
                "gpus": {str(i): [g.model, g.pool] for i, g in sorted(node.gpus.items())},
            }
            for name, node in sorted(state.nodes.items())
        },
        "accounts": {
            name: {
                "parent": account.parent,
                "shares": account.shares,
                "users": list(account.users),
                "coordinators": list(account.coordinators),
                "quotas": {r: list(q) for r, q in sorted(account.quotas.items())},
            }
            for name, account in sorted(state.accounts.items())
        },
        "priority_classes": {
            name: [c.priority, c.may_preempt] for name, c in sorted(state.priority_classes.items())
        },
        "limits": {
            "/".join(identity): [limits.max_submit_jobs, limits.max_array_size, limits.max_gpus]
            for identity, limits in sorted(state.limits.items())
        },
        "decayed_usage": {
            name: round(usage.value, 3) for name, usage in sorted(state.decayed_usage.items())
        },
        "audit": {"verified": report.verified, "mismatches": report.mismatches},
    }
