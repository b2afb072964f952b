"""The queue order under a QueuePolicySet: age, fair share and size add priority points."""

from __future__ import annotations

from gpuloom.decide.queueing import decide_queue
from gpuloom.events import QueuePolicySet
from gpuloom.queueing.order import pending_in_order, queue_order
from gpuloom.testing.builders import LogBuilder


def jobs_in_order(log: LogBuilder) -> list[str]:
    return [job.job_id for job in queue_order(log.state())]


def test_without_a_policy_the_order_is_priority_then_submission() -> None:
    log = LogBuilder()
    log.register("n1", 4)
    log.run_to_queue("old", gpus=1)
    log.run_to_queue("urgent", gpus=1, priority=5)
    log.run_to_queue("new", gpus=1)
    assert jobs_in_order(log) == ["urgent", "old", "new"]


def test_age_lets_an_old_job_overtake_a_slightly_higher_priority() -> None:
    log = LogBuilder()
    log.register("n1", 4)
    log.append(QueuePolicySet(weight_age=30, max_age_s=7200.0))
    log.run_to_queue("old", gpus=1)
    log.run_to_queue("urgent", gpus=1, priority=5, after=1800)
    # old has waited 30 minutes: +7.5 points beat urgent's 5...
    assert jobs_in_order(log) == ["old", "urgent"]
    log2 = LogBuilder()
    log2.register("n1", 4)
    log2.append(QueuePolicySet(weight_age=30, max_age_s=7200.0))
    log2.run_to_queue("old", gpus=1)
    log2.run_to_queue("urgent", gpus=1, priority=5, after=60)
    assert jobs_in_order(log2) == ["urgent", "old"], "a minute of age is worth less than 5"
    # ...and an hour later old (+22.5) still leads urgent (5 + 15): age keeps counting
    log.append(
        QueuePolicySet(weight_age=30, max_age_s=7200.0, fair_share_half_life_s=60.0), after=3600
    )
    ranked = pending_in_order(log.state())
    assert [job.job_id for job, _ in ranked] == ["old", "urgent"]
    old, urgent = (factors for _, factors in ranked)
    assert old.age > urgent.age and old.total > urgent.total


def test_fair_share_favours_the_account_that_used_less() -> None:
    log = LogBuilder()
    log.register("n1", 4)
    log.append(QueuePolicySet(weight_fair_share=100))
    log.run_to_queue("heavy-1", gpus=1, account="heavy")
    log.place("heavy-1", "n1", [0])
    log.start("heavy-1", "n1")
    log.finish("heavy-1", "n1", outcome="succeeded", after=3600)
    log.charge("heavy-1", seconds=3600.0, account="heavy")
    log.run_to_queue("heavy-2", gpus=1, account="heavy")
    log.run_to_queue("light-1", gpus=1, account="light")
    assert jobs_in_order(log) == ["light-1", "heavy-2"]
    factors = {job.job_id: f for job, f in pending_in_order(log.state())}
    assert factors["light-1"].fair_share == 1_000_000  # used nothing
    assert factors["heavy-2"].fair_share == 250_000  # all usage on a half share: 2^-2


def test_the_queue_records_its_configured_policy_once() -> None:
    log = LogBuilder()
    log.register("n1", 4)
    wanted = QueuePolicySet(weight_age=7)
    [decision] = decide_queue(log.state(), wanted)
    assert decision.event == wanted
    log.record_decisions([decision])
    assert decide_queue(log.state(), wanted) == []
    assert decide_queue(log.state(), None) == []


def test_accounts_and_shares_fold_and_weigh_fair_share() -> None:
    from gpuloom.events import AccountCreated, SharesSet

    log = LogBuilder()
    log.register("n1", 4)
    log.append(AccountCreated(account="org"))
    log.append(AccountCreated(account="big", parent="org"))
    log.append(SharesSet(account="big", shares=3))
    orphan = log.append(AccountCreated(account="lost", parent="nowhere"))
    unknown = log.append(SharesSet(account="ghost", shares=2))
    state = log.state()
    assert {n: (a.parent, a.shares) for n, a in state.accounts.items()} == {
        "org": (None, 1),
        "big": ("org", 3),
    }
    voided = {v.seq: v.reason for v in state.recent_voided}
    assert voided == {
        orphan.seq: "parent account nowhere does not exist",
        unknown.seq: "account ghost does not exist",
    }
    # equal usage: the account with 3 shares keeps the higher fair-share factor
    log.append(QueuePolicySet(weight_fair_share=100))
    for name, account in (("b1", "big"), ("s1", "small")):
        log.run_to_queue(name, gpus=1, account=account)
        log.place(name, "n1", [0 if name == "b1" else 1])
        log.start(name, "n1")
        log.finish(name, "n1", outcome="succeeded", after=60)
        log.charge(name, seconds=60.0, account=account)
    log.run_to_queue("small-next", gpus=1, account="small")
    log.run_to_queue("big-next", gpus=1, account="big")
    assert jobs_in_order(log) == ["big-next", "small-next"]
