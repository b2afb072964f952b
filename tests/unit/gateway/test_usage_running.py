"""What runs going on have used since their last charge (`GET /v1/usage`'s `running`):
so that a user watching the usage view while four GPUs are busy does not read a flat
zero until accounting's next interim charge."""

from __future__ import annotations

from datetime import timedelta

from rich.console import Console

from gpuloom.auth.policy import Scope
from gpuloom.client.render import usage_tables
from gpuloom.testing.builders import LogBuilder
from services.gateway.reads.usage import running_usage


def test_running_jobs_count_from_their_start_or_last_charge_within_the_scope() -> None:
    log = LogBuilder()
    log.register("n1", 4)
    log.run_to_queue("a", gpus=2, user="alice", account="research")
    log.place("a", "n1", [0, 1])
    log.start("a", "n1")
    started = log.now
    log.run_to_queue("b", gpus=1, user="bob", account="prod")
    log.place("b", "n1", [2])
    log.start("b", "n1")
    now = started + timedelta(seconds=600)
    state = log.state()
    found = {(r.user, r.account): r for r in running_usage(state, None, now)}
    assert found[("alice", "research")].gpu_seconds == 2 * 600
    assert found[("alice", "research")].jobs == 1
    assert 0 < found[("bob", "prod")].gpu_seconds < 600
    mine = running_usage(state, Scope(user="alice", accounts=frozenset()), now)
    assert [(r.user, r.account) for r in mine] == [("alice", "research")]
    usage = {"accounts": [], "users": [], "running": [r.model_dump() for r in mine]}
    console = Console(width=200, record=True)
    for table in usage_tables(usage):  # type: ignore[arg-type]
        console.print(table)
    lines = [" ".join(line.split()) for line in console.export_text().splitlines()]
    assert any("running now, not yet charged" in line for line in lines), lines
    assert "alice research 1 0.33 1200.0" in lines, lines
