"""Assertions shared by the core tests: what "voided" means, and the state invariants."""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter

from gpuloom.events import Recorded
from gpuloom.state import (
    FINAL_PHASES,
    ON_NODE_PHASES,
    PENDING_PHASES,
    ClusterState,
    apply,
)
from gpuloom.state.tenancy import CLUSTER_TOTAL


def apply_expecting_void(state: ClusterState, recorded: Recorded, reason: str) -> None:
    """Apply `recorded` to `state` and assert it was voided with `reason` and changed nothing
    but `seq`, `voided` and `recent_voided`."""
    before = copy.deepcopy(state)
    apply(state, recorded)
    assert state.voided == before.voided + 1
    assert state.applied == before.applied
    assert state.seq == recorded.seq
    last = state.recent_voided[-1]
    assert (last.seq, last.type) == (recorded.seq, recorded.envelope.type)
    assert reason in last.reason, f"reason {last.reason!r} does not say {reason!r}"
    untouched = dataclasses.replace(
        state, seq=before.seq, voided=before.voided, recent_voided=before.recent_voided
    )
    assert untouched == before


def check_invariants(state: ClusterState, events_seen: int) -> None:
    """Everything that must hold after any prefix of any log."""
    assert state.applied + state.voided == events_seen
    held: dict[tuple[str, int], str] = {}
    for node in state.nodes.values():
        for index, gpu in node.gpus.items():
            assert gpu.index == index
            if gpu.job_id is None:
                continue
            job = state.jobs[gpu.job_id]
            assert job.phase in ON_NODE_PHASES, f"{job.job_id} is {job.phase} but holds a GPU"
            assert job.node == node.name
            assert index in job.gpu_indexes
            assert job.gpu_uuids[job.gpu_indexes.index(index)] == gpu.uuid
            held[(node.name, index)] = job.job_id
    for job in state.jobs.values():
        mine = sorted(i for (n, i), j in held.items() if j == job.job_id)
        if job.phase in ON_NODE_PHASES:
            assert job.node is not None
            node = state.nodes[job.node]
            assert node.phase == "ready", f"{job.job_id} is {job.phase} on lost {node.name}"
            assert len(job.gpu_indexes) == job.spec.gpus
            assert mine == sorted(job.gpu_indexes), "no GPU is shared by two jobs"
            for index in job.gpu_indexes:
                model = node.gpus[index].model
                assert not job.spec.gpu_model or model in job.spec.gpu_model
        else:
            assert mine == [], f"{job.job_id} is {job.phase} and holds {mine}"
        if job.phase in ("submitted", "admitted", "queued"):  # (a final one shows its last)
            assert job.node is None and not job.replicas, f"{job.job_id} keeps a placement"
            assert job.preempted_by is None, f"{job.job_id} is {job.phase}, still preempted"
        if job.yields_to is not None:  # a requeued victim, until it is placed again
            assert job.phase in ("queued", *FINAL_PHASES) and job.yields_to != job.job_id
        assert (job.phase == "running") == (job.current_run() is not None)
        attempts = [run.attempt for run in job.runs]
        assert attempts == sorted(set(attempts)) and all(a <= job.attempt for a in attempts)
        if job.phase in FINAL_PHASES:
            assert job.finished_at is not None
    _check_indexes(state)


def _check_indexes(state: ClusterState) -> None:
    def phase_is(*phases: str) -> set[str]:
        return {j.job_id for j in state.jobs.values() if j.phase in phases}

    assert state.submitted == phase_is("submitted")
    assert state.admitted == phase_is("admitted")
    assert state.queued == phase_is("queued")
    queued = [state.jobs[j] for j in state.queued]
    assert state.queued_with_dependencies == {j.job_id for j in queued if j.spec.depends_on}
    assert state.queued_yielding == {j.job_id for j in queued if j.yields_to is not None}
    live: Counter[tuple[str, str]] = Counter()
    for job in state.jobs.values():
        if not job.is_final:
            live.update([("user", job.spec.user), ("account", job.spec.account), CLUSTER_TOTAL])
    assert state.live_jobs == dict(live)
    on_node = {(node, j) for node, jobs in state.on_node.items() for j in jobs}
    assert on_node == {(j.node, j.job_id) for j in state.jobs.values() if j.phase in ON_NODE_PHASES}
    assert state.cancel_pending == {
        j.job_id for j in state.jobs.values() if j.phase in PENDING_PHASES and j.cancel_requested
    }
    assert state.uncharged == {
        j.job_id
        for j in state.jobs.values()
        if any(r.ended_at is not None and r.attempt not in j.charged_attempts for r in j.runs)
    }
    assert sum(state.usage_by_account.values()) == sum(state.usage_by_user.values())
    keyed_jobs = {k: job for k, job in state.idempotency_keys.items() if job not in state.arrays}
    keyed = {j.idempotency_key: j.job_id for j in state.jobs.values() if j.idempotency_key}
    keyed.update(
        (t.idempotency_key, job_id) for job_id, t in state.tombstones.items() if t.idempotency_key
    )
    assert keyed_jobs == keyed
    _check_retention(state)


def _check_retention(state: ClusterState) -> None:
    """Live jobs and tombstones are apart; no job that ended and was charged stays live
    (unless the state keeps history); every tombstone is queued to expire."""
    assert not set(state.jobs) & set(state.tombstones)
    if not state.keep_history:
        done = {j.job_id for j in state.jobs.values() if j.is_final} - state.uncharged
        assert not done, f"{sorted(done)} ended and were charged but are still live"
    waiting = {job_id for _, job_id in state.retired[state.retired_head :]}
    assert set(state.tombstones) <= waiting
    times = [at for at, _ in state.retired]
    assert times == sorted(times), "tombstones expire in the order they were made"
    for dependency, dependents in state.dependents.items():
        assert dependents, f"an empty dependents entry for {dependency}"
        assert dependents <= set(state.jobs), "only live jobs wait on a dependency"
