"""Audit and replay over snapshots: an audit from a snapshot re-makes the decisions after
it as the audit from seq 1 does, an audit proves the snapshots it passes and names a
tampered one, and a replay from a snapshot gives the replay from seq 1."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuloom.audit import (
    SnapshotClaim,
    audit,
    first_difference,
    newest_trusted,
    snapshot,
    state_at,
)
from gpuloom.events import JobPlaced, JobPreempted, JobReserved, Recorded
from gpuloom.state import ClusterState
from gpuloom.state.snapshot import decode_snapshot, encode_snapshot
from gpuloom.testing.builders import LogBuilder

from .test_audit import JOB_SHAPES, POLICIES, run_log

CYCLE = (JobPlaced, JobPreempted, JobReserved)


def claim(log: LogBuilder, seq: int, source: str = "placement") -> SnapshotClaim:
    """The snapshot a service would store at `seq`: the fold of the log up to it."""
    data = encode_snapshot(log.state(upto=seq))
    return SnapshotClaim(f"GPULOOM_SNAP_{source.upper()}", source, f"seq-{seq:015d}", seq, data)


def decisions_after(records: list[Recorded], cut: int) -> tuple[int, int]:
    """(decisions after `cut` whose basis is at or after it, those whose basis is before)."""
    after = [r.event for r in records if r.seq > cut and isinstance(r.event, CYCLE)]
    return (
        sum(1 for e in after if e.basis_seq >= cut),
        sum(1 for e in after if e.basis_seq < cut),
    )


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=st.sampled_from(POLICIES),
    shapes=st.lists(JOB_SHAPES, min_size=2, max_size=12),
    finish_every=st.integers(0, 3),
    cut_at=st.floats(0.0, 1.0),
)
def test_an_audit_from_a_snapshot_re_makes_the_decisions_after_it_as_one_from_seq_1(
    policy: str, shapes: list[dict[str, object]], finish_every: int, cut_at: float
) -> None:
    log = run_log(policy, shapes, finish_every)
    records = log.records
    cut = max(1, int(cut_at * records[-1].seq))
    start = decode_snapshot(encode_snapshot(log.state(upto=cut)))
    rest = [r for r in records if r.seq > cut]

    from_start = audit(records, from_seq=cut + 1)
    end = claim(log, records[-1].seq)
    from_snapshot = audit(rest, start=start, snapshots=[end])
    remade, before = decisions_after(records, cut)

    assert from_start.ok and from_snapshot.ok, (from_start.mismatches, from_snapshot.mismatches)
    assert from_snapshot.start_seq == cut and from_snapshot.from_seq == cut + 1
    assert from_snapshot.to_seq == from_start.to_seq == records[-1].seq
    assert from_snapshot.verified == remade and from_snapshot.before_start == before
    assert from_snapshot.verified + from_snapshot.before_start == from_start.verified
    # and the fold from the snapshot reaches the end of the log as the fold from seq 1
    assert [c.outcome for c in from_snapshot.snapshots] == ["proved"]


def test_a_cut_between_cycles_verifies_exactly_the_same_decisions() -> None:
    log = run_log("bestfit", [{"gpus": 1}, {"gpus": 2}, {"gpus": 1, "gpu_milli": 250}] * 3, 2)
    records = log.records
    cuts = [r.seq for r in records if not isinstance(r.event, CYCLE)]
    for cut in cuts[len(cuts) // 3 :: 5]:
        if decisions_after(records, cut)[1]:
            continue  # a cycle straddles this cut
        start = decode_snapshot(encode_snapshot(log.state(upto=cut)))
        from_snapshot = audit([r for r in records if r.seq > cut], start=start)
        from_start = audit(records, from_seq=cut + 1)
        assert from_snapshot.verified == from_start.verified > 0
        assert from_snapshot.before_start == 0


def test_an_audit_proves_every_snapshot_it_passes() -> None:
    log = run_log("fgd", [{"gpus": 1}, {"gpus": 2}, {"gpus": 1, "gpu_milli": 500}] * 2, 2)
    seqs = [4, len(log.records) // 2, log.records[-1].seq]
    claims = [claim(log, seq) for seq in seqs] + [claim(log, seqs[1], "queue")]
    report = audit(log.records, snapshots=claims)
    assert report.ok, report.mismatches
    assert [(c.seq, c.outcome) for c in report.snapshots] == [
        (seqs[0], "proved"),
        (seqs[1], "proved"),
        (seqs[1], "proved"),
        (seqs[2], "proved"),
    ]
    assert report.proved[0].line() == (
        f"snapshot seq-{seqs[0]:015d} of placement is the fold of the log up to seq {seqs[0]}"
    )


def test_a_tampered_snapshot_is_a_mismatch_that_names_it_and_the_field() -> None:
    log = run_log("bestfit", [{"gpus": 1}, {"gpus": 2}, {"gpus": 1}], 0)
    seq = log.records[-1].seq - 1
    forged = log.state(upto=seq)
    job = sorted(forged.jobs)[0]
    forged.jobs[job] = dataclasses.replace(forged.jobs[job], priority=99)
    bad = SnapshotClaim(
        "GPULOOM_SNAP_PLACEMENT", "placement", f"seq-{seq:015d}", seq, encode_snapshot(forged)
    )
    report = audit(log.records, snapshots=[claim(log, 3), bad])
    assert not report.ok
    assert [c.outcome for c in report.snapshots] == ["proved", "differs"]
    [mismatch] = report.mismatches
    assert mismatch.startswith(
        f"snapshot seq-{seq:015d} of placement is not the fold of the log up to seq {seq}: "
        f"first difference in jobs['{job}'].priority: "
    ), mismatch
    assert "99 in the snapshot" in mismatch
    assert report.verified > 0, "the decisions are audited all the same"


def test_a_snapshot_that_does_not_decode_is_skipped_not_failed() -> None:
    log = run_log("bestfit", [{"gpus": 1}, {"gpus": 1}], 0)
    good = claim(log, 5)
    cut = dataclasses.replace(good, data=good.data[: len(good.data) // 2])
    misnamed = dataclasses.replace(claim(log, 6), name="seq-000000000000007", seq=7)
    past = claim(log, log.records[-1].seq)
    past = dataclasses.replace(past, seq=past.seq + 10, name="seq-beyond")
    report = audit(log.records, snapshots=[cut, misnamed, past])
    assert report.ok, report.mismatches
    outcomes = {c.name: (c.outcome, c.detail) for c in report.snapshots}
    assert outcomes[good.name][0] == "skipped" and "truncated" in outcomes[good.name][1]
    assert outcomes["seq-000000000000007"] == ("skipped", "it holds the state at seq 6")
    assert outcomes["seq-beyond"][0] == "skipped" and "past the end" in outcomes["seq-beyond"][1]


def test_an_audit_from_a_snapshot_proves_the_later_ones_and_skips_earlier_ones() -> None:
    log = run_log("pack", [{"gpus": 1}, {"gpus": 2}, {"gpus": 1}] * 2, 2)
    last = log.records[-1].seq
    start_seq = last // 2
    start = decode_snapshot(claim(log, start_seq).data)
    rest = [r for r in log.records if r.seq > start_seq]
    report = audit(rest, start=start, snapshots=[claim(log, 3), claim(log, last - 1)])
    assert report.ok
    assert [c.outcome for c in report.snapshots] == ["skipped", "proved"]
    assert "before the start" in report.snapshots[0].detail


def test_replay_from_a_snapshot_equals_replay_from_seq_1() -> None:
    log = run_log("bestfit", [{"gpus": 1}, {"gpus": 2}, {"gpus": 1, "gpu_milli": 250}] * 2, 2)
    records = log.records
    last = records[-1].seq
    for base in (1, last // 3, last // 2):
        for point in (base, base + 3, last):
            start = decode_snapshot(encode_snapshot(log.state(upto=base)))
            rest = [r for r in records if r.seq > base]
            assert state_at(rest, seq=point, start=start) == state_at(records, seq=point)
    # by time: a snapshot whose clock is not past the time asked
    when = records[last // 2].envelope.at + timedelta(microseconds=1)
    claims = [claim(log, seq) for seq in (2, last // 3, last // 2 + 5, last)]
    chosen, skipped = newest_trusted(claims, at=when)
    assert chosen is not None and not skipped
    assert chosen.claim.seq == last // 3
    replayed = state_at(
        [r for r in records if r.seq > chosen.state.seq], at=when, start=chosen.state
    )
    assert snapshot(replayed) == snapshot(state_at(records, at=when))
    assert replayed == state_at(records, at=when)


def test_the_newest_trusted_snapshot_not_past_the_point() -> None:
    log = run_log("bestfit", [{"gpus": 1}, {"gpus": 1}], 0)
    claims = [claim(log, 4), claim(log, 8, "queue"), claim(log, 10)]
    broken = dataclasses.replace(claims[2], data=b"GPULOOM-SNAPSHOT\n")
    chosen, skipped = newest_trusted([claims[0], claims[1], broken])
    assert chosen is not None and chosen.claim is claims[1] and chosen.state.seq == 8
    assert [(s.seq, s.outcome) for s in skipped] == [(10, "skipped")]
    chosen, skipped = newest_trusted(claims, seq=7)
    assert chosen is not None and chosen.claim is claims[0] and not skipped
    assert newest_trusted(claims, seq=3) == (None, [])


def test_first_difference_names_the_first_differing_field() -> None:
    log = run_log("bestfit", [{"gpus": 1}, {"gpus": 2}], 0)
    state = log.state()
    assert first_difference(state, decode_snapshot(encode_snapshot(state))) is None
    other = decode_snapshot(encode_snapshot(state))
    job = sorted(other.jobs)[0]
    other.queued.add("ghost")
    assert first_difference(state, other) == "queued: 'ghost' only in the snapshot"
    del other.jobs[job]
    assert first_difference(state, other) == f"jobs['{job}']: in the fold, not in the snapshot"
    assert first_difference(ClusterState(), ClusterState(seq=3)) == (
        "seq: 0 in the fold, 3 in the snapshot"
    )


def test_the_audit_core_stays_pure() -> None:
    probe = (
        "import importlib, json, sys\n"
        "importlib.import_module('gpuloom.audit')\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = json.loads(result.stdout)
    forbidden = ("nats", "sqlalchemy", "fastapi", "httpx", "opentelemetry")
    assert [m for m in loaded if m.split(".")[0] in forbidden] == []
