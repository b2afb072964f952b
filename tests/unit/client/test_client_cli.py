"""The `gpuloom` CLI against a fake gateway (httpx.MockTransport): what it sends,
what it prints, and how it fails."""

from __future__ import annotations

import json
import sys
import types

import httpx
import pytest
from fakegateway import JOB_A, JOB_B, NEW_JOB, USAGE, FakeGateway, Invoke
from typer.testing import CliRunner

from gpuloom.client.cli import app
from gpuloom.client.context import CliState


def test_submit_sends_the_job_and_the_idempotency_key(cli: Invoke, fake: FakeGateway) -> None:
    result = cli(
        [
            "submit", "--user", "alice", "--account", "research", "--gpus", "2",
            "--gpu-model", "A100-80GB", "--gpu-model", "H100-80GB",
            "--priority", "7", "--time-limit", "600", "--env", "LR=0.1", "--env", "X=a=b",
            "--idempotency-key", "key-1",
            "--", "/usr/bin/python3", "train.py", "--epochs", "3",
        ]
    )  # fmt: skip

    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == NEW_JOB
    request = fake.requests[-1]
    assert (request.method, request.url.path) == ("POST", "/v1/jobs")
    assert request.headers["Idempotency-Key"] == "key-1"
    assert fake.last_json() == {
        "name": "python3",
        "user": "alice",
        "account": "research",
        "command": ["/usr/bin/python3", "train.py", "--epochs", "3"],
        "gpus": 2,
        "gpu_model": ["A100-80GB", "H100-80GB"],
        "priority": 7,
        "time_limit_s": 600,
        "env": {"LR": "0.1", "X": "a=b"},
    }


def test_submit_defaults_and_no_key_header(cli: Invoke, fake: FakeGateway) -> None:
    result = cli(["submit", "--name", "hello", "sh", "-c", "echo hi"])

    assert result.exit_code == 0, result.output
    request = fake.requests[-1]
    assert "Idempotency-Key" not in request.headers
    assert fake.last_json() == {  # no user, class nor priority: the gateway decides them
        "name": "hello",
        "account": "default",
        "command": ["sh", "-c", "echo hi"],
        "gpus": 0,
    }


def test_submit_rejects_a_malformed_env_as_a_usage_error(cli: Invoke, fake: FakeGateway) -> None:
    result = cli(["submit", "--env", "NOEQUALS", "--", "true"])

    assert result.exit_code == 2
    assert "expected KEY=VALUE" in result.stderr
    assert fake.requests == []


@pytest.mark.parametrize(
    ("states", "exit_code"),
    [(["queued", "running", "succeeded"], 0), (["running", "failed"], 1)],
    ids=["a job that succeeds exits 0", "a job that fails exits 1"],
)
def test_submit_wait_polls_until_a_final_state(
    cli: Invoke, fake: FakeGateway, states: list[str], exit_code: int
) -> None:
    fake.states = states

    result = cli(["submit", "--wait", "--", "python", "train.py"])

    assert result.exit_code == exit_code, result.output
    assert result.stdout.strip() == NEW_JOB
    for state in states:
        assert f"{NEW_JOB}: {state}" in result.stderr


def test_jobs_prints_a_table_and_sends_the_filters(cli: Invoke, fake: FakeGateway) -> None:
    result = cli(["jobs", "--state", "running", "--user", "alice", "--limit", "5"])

    assert result.exit_code == 0, result.output
    params = dict(fake.requests[-1].url.params)
    assert params == {"state": "running", "user": "alice", "limit": "5", "order": "newest"}
    for text in (JOB_A, JOB_B, "running", "succeeded", "2 [0,1]", "2026-01-02 03:04:05"):
        assert text in result.stdout
    caption = " ".join(result.stdout.split())
    assert "2 of 42 jobs, newest first (--offset 2 for the next, --all for every one)" in caption


def test_jobs_lists_the_oldest_first_or_every_one_page_after_page(
    cli: Invoke, fake: FakeGateway
) -> None:
    """`--oldest` asks submission order; `--all` asks pages until the list has every job
    (the fake answers two of 42 each time, then none)."""
    assert cli(["jobs", "--oldest"]).exit_code == 0
    assert fake.requests[-1].url.params["order"] == "oldest"
    fake.requests.clear()
    result = cli(["jobs", "--all", "--json"])
    assert result.exit_code == 0, result.output
    offsets = [r.url.params.get("offset") for r in fake.requests]
    assert offsets[0] is None and offsets[1] == "2", offsets
    assert all(r.url.params["limit"] == "5000" for r in fake.requests)


def test_a_stale_answer_is_shown_with_a_note_on_stderr(cli: Invoke, fake: FakeGateway) -> None:
    assert "out of date" not in cli(["jobs"]).stderr
    fake.stale = "starting"
    result = cli(["jobs"])
    assert result.exit_code == 0, result.output
    assert JOB_A in result.stdout  # the answer is still printed, with the note
    assert "read model is starting, 1200 events behind the log" in result.stderr
    assert "out of date" in result.stderr


def test_jobs_json_prints_the_gateway_answer(cli: Invoke, fake: FakeGateway) -> None:
    result = cli(["jobs", "--json"])

    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"jobs": list(fake.jobs.values()), "total": 42}


def test_show_prints_the_job_and_its_event_trail(cli: Invoke) -> None:
    result = cli(["show", JOB_A])

    assert result.exit_code == 0, result.output
    for text in (JOB_A, "python train.py", "node-a", "JobSubmitted", "JobAdmitted", "placement"):
        assert text in result.stdout


def test_show_of_an_unknown_job_says_not_found(cli: Invoke) -> None:
    result = cli(["show", "nope"])

    assert result.exit_code == 1
    assert result.stderr.strip() == "error: job nope not found (HTTP 404)"


def test_cancel_prints_the_request(cli: Invoke, fake: FakeGateway) -> None:
    result = cli(["cancel", JOB_A])

    assert result.exit_code == 0, result.output
    assert fake.requests[-1].method == "DELETE"
    assert f"cancel requested for {JOB_A}" in result.stdout


def test_cancel_of_a_final_job_shows_the_409_detail_in_one_line(cli: Invoke) -> None:
    result = cli(["cancel", JOB_B])

    assert result.exit_code == 1
    assert result.stderr == f"error: job {JOB_B} already succeeded (HTTP 409)\n"
    assert "Traceback" not in result.output


def test_logs_prints_stdout_or_stderr_and_sends_the_tail(cli: Invoke, fake: FakeGateway) -> None:
    out = cli(["logs", JOB_A])
    err = cli(["logs", JOB_A, "--stderr", "--tail", "100"])

    assert out.stdout == "epoch 1 loss 0.5\n"
    assert err.stdout == "warning: slow disk\n"
    assert fake.requests[-1].url.params["tail_bytes"] == "100"


def test_nodes_summarises_gpus_per_node(cli: Invoke) -> None:
    result = cli(["nodes"])

    assert result.exit_code == 0, result.output
    for text in ("node-a", "4 x A100-80GB", "2/4", "2,3", JOB_A, "node-b", "lost", "0/2"):
        assert text in result.stdout


def test_usage_prints_accounts_and_users_in_gpu_hours(cli: Invoke) -> None:
    result = cli(["usage"])

    assert result.exit_code == 0, result.output
    assert "usage per account" in result.stdout and "usage per user" in result.stdout
    assert "2.00" in result.stdout and "7200.0" in result.stdout
    assert result.stdout.index("research") < result.stdout.index("prod")
    assert json.loads(cli(["usage", "--json"]).stdout) == USAGE


def test_health(cli: Invoke) -> None:
    result = cli(["health"])

    assert result.exit_code == 0, result.output
    assert "NATS connected" in result.stdout


def test_unknown_service_name_lists_the_services(cli: Invoke) -> None:
    result = cli(["serve", "scheduler"])

    assert result.exit_code == 2
    assert "unknown service 'scheduler'" in result.stderr
    assert (
        "gateway, projector, admission, queue, placement, dispatch, inventory, accounting, "
        "webhooks, agent" in (result.stderr)
    )


def test_serve_passes_extra_arguments_to_the_entrypoint(
    cli: Invoke, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []
    module = types.ModuleType("services.agent.__main__")
    module.entrypoint = calls.append  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "services.agent.__main__", module)

    result = cli(["serve", "agent", "--inventory", "f.yaml"])

    assert result.exit_code == 0, result.output
    assert calls == [["--inventory", "f.yaml"]]


def test_an_unreachable_gateway_is_one_clear_line(fake: FakeGateway) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    state = CliState(url="http://gw.example:9999", transport=httpx.MockTransport(refuse))
    result = CliRunner().invoke(app, ["jobs"], obj=state)

    assert result.exit_code == 1
    assert result.stderr == (
        "error: cannot reach the gateway at http://gw.example:9999: "
        "[Errno 111] Connection refused\n"
    )


def test_gateway_port_from_the_environment(
    cli: Invoke, fake: FakeGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPULOOM_GATEWAY_PORT", "18080")

    assert cli(["nodes"]).exit_code == 0
    assert str(fake.requests[-1].url) == "http://127.0.0.1:18080/v1/nodes"
    assert cli(["--url", "http://gw:1/", "nodes"]).exit_code == 0
    assert str(fake.requests[-1].url) == "http://gw:1/v1/nodes"


def test_a_bad_gateway_port_is_a_usage_error(cli: Invoke, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULOOM_GATEWAY_PORT", "http")

    result = cli(["nodes"])

    assert result.exit_code == 2
    assert "GPULOOM_GATEWAY_PORT='http' is not a TCP port" in result.stderr


def test_submit_sends_the_resource_request(cli: Invoke, fake: FakeGateway) -> None:
    result = cli(
        [
            "submit", "--name", "slice", "--gpus", "2", "--gpu-milli", "250",
            "--gpu-memory", "4096", "--cpu-milli", "8000", "--memory", "16384",
            "--pool", "vgpu", "--locality", "local-first", "--selector", "zone=b",
            "--replicas", "3", "--", "python", "train.py",
        ]
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    sent = fake.last_json()
    assert {
        k: sent[k] for k in sent if k not in ("name", "user", "account", "command", "priority")
    } == {
        "gpus": 2,
        "gpu_milli": 250,
        "gpu_memory_mib": 4096,
        "cpu_milli": 8000,
        "memory_mib": 16384,
        "pool": "vgpu",
        "locality": "local-first",
        "node_selector": {"zone": "b"},
        "replicas": 3,
    }


def test_usage_passes_the_window_and_prints_csv(cli: Invoke, fake: FakeGateway) -> None:
    result = cli(["usage", "--since", "2026-01-01T00:00:00", "--json"])
    assert result.exit_code == 0, result.output
    request = fake.requests[-1]
    assert request.url.path == "/v1/usage"
    assert request.url.params["since"] == "2026-01-01T00:00:00"


def test_show_says_why_it_shows_no_events_of_a_job_one_may_not_read(
    cli: Invoke, fake: FakeGateway
) -> None:
    fake.private.add(JOB_B)
    result = cli(["show", JOB_B])
    assert result.exit_code == 0, result.output
    assert "events: not shown (only its owner" in " ".join(result.stdout.split())
