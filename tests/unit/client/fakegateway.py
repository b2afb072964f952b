"""An in-memory gateway behind `httpx.MockTransport`, speaking the REST contract."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from typer.testing import Result

JOB_A = "01JCLIENTTEST0000000000000A"
JOB_B = "01JCLIENTTEST0000000000000B"
NEW_JOB = "01JCLIENTTEST00000000000NEW"

#: The `cli` fixture: run `gpuloom ARGS` against the fake gateway.
Invoke = Callable[[Sequence[str]], Result]


def job(job_id: str, **fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": job_id,
        "name": "train",
        "user": "alice",
        "account": "research",
        "state": "running",
        "reason": None,
        "node": "node-a",
        "gpus": [0, 1],
        "gpus_requested": 2,
        "gpu_model": ["A100-80GB"],
        "priority": 5,
        "command": ["python", "train.py"],
        "attempt": 1,
        "cancel_requested": False,
        "exit_code": None,
        "submitted_at": "2026-01-02T03:04:05.123456Z",
        "started_at": "2026-01-02T03:04:07Z",
        "finished_at": None,
    }
    doc.update(fields)
    return doc


NODES = {
    "nodes": [
        {
            "name": "node-a",
            "state": "ready",
            "simulated": True,
            "labels": {},
            "cpu_milli": 64000,
            "memory_mib": 524288,
            "gpus": [
                {
                    "index": i,
                    "uuid": f"GPU-sim-node-a-{i}",
                    "model": "A100-80GB",
                    "memory_mib": 81920,
                    "allocated": i < 2,
                    "job_id": JOB_A if i < 2 else None,
                }
                for i in range(4)
            ],
        },
        {
            "name": "node-b",
            "state": "lost",
            "simulated": True,
            "labels": {},
            "cpu_milli": 32000,
            "memory_mib": 262144,
            "gpus": [
                {
                    "index": i,
                    "uuid": f"GPU-sim-node-b-{i}",
                    "model": "H100-80GB",
                    "memory_mib": 81920,
                    "allocated": False,
                    "job_id": None,
                }
                for i in range(2)
            ],
        },
    ]
}

USAGE = {
    "accounts": [
        {"account": "research", "gpu_seconds": 7200.0, "jobs": 3},
        {"account": "prod", "gpu_seconds": 90.0, "jobs": 1},
    ],
    "users": [
        {"user": "alice", "account": "research", "gpu_seconds": 7200.0, "jobs": 3},
        {"user": "bob", "account": "prod", "gpu_seconds": 90.0, "jobs": 1},
    ],
}


@dataclass
class FakeGateway:
    """Answers like the gateway; records every request it got.

    `states` lists the states `GET /v1/jobs/NEW_JOB` goes through, one per poll
    (the last one repeats).
    """

    jobs: dict[str, dict[str, Any]] = field(
        default_factory=lambda: {
            JOB_A: job(JOB_A),
            JOB_B: job(JOB_B, state="succeeded", user="bob", account="prod", exit_code=0),
        }
    )
    states: list[str] = field(default_factory=lambda: ["queued", "running", "succeeded"])
    requests: list[httpx.Request] = field(default_factory=list)
    #: Answer reads as a gateway still catching up with the log (`Gpuloom-Stale`).
    stale: str | None = None
    #: Jobs whose events the caller may not read (403), as another user's.
    private: set[str] = field(default_factory=set)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        response = self._route(request)
        if self.stale is not None and request.method == "GET":
            response.headers["gpuloom-stale"] = self.stale
            response.headers["gpuloom-projection-lag"] = "1200"
        return response

    def _route(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        parts = request.url.path.strip("/").split("/")
        route = (request.method, *parts)
        match route:
            case ("POST", "v1", "jobs"):
                return httpx.Response(202, json={"id": NEW_JOB, "state": "submitted"})
            case ("GET", "v1", "jobs"):
                return httpx.Response(
                    200, json={"jobs": list(self.jobs.values()), "total": len(self.jobs) + 40}
                )
            case ("GET", "v1", "jobs", job_id):
                return self._get_job(job_id)
            case ("DELETE", "v1", "jobs", job_id):
                return self._cancel(job_id)
            case ("GET", "v1", "jobs", job_id, "events") if job_id in self.private:
                return httpx.Response(403, json={"detail": "not yours"})
            case ("GET", "v1", "jobs", job_id, "events") if job_id in self.jobs:
                return httpx.Response(200, json=self.events(job_id))
            case ("GET", "v1", "jobs", job_id, "logs") if job_id in self.jobs:
                return httpx.Response(
                    200,
                    json={
                        "job_id": job_id,
                        "node": "node-a",
                        "attempt": 1,
                        "stdout": "epoch 1 loss 0.5\n",
                        "stderr": "warning: slow disk\n",
                    },
                )
            case ("GET", "v1", "nodes"):
                return httpx.Response(200, json=NODES)
            case ("GET", "v1", "usage"):
                return httpx.Response(200, json=USAGE)
            case ("GET", "healthz"):
                return httpx.Response(200, json={"status": "ok", "nats": True, "projection_seq": 9})
        return httpx.Response(404, json={"detail": f"no route {request.method} {request.url.path}"})

    def _get_job(self, job_id: str) -> httpx.Response:
        if job_id == NEW_JOB:
            polls = sum(1 for r in self.requests if r.url.path.endswith(NEW_JOB))
            state = self.states[min(polls, len(self.states)) - 1]
            exit_code = 0 if state == "succeeded" else 3
            return httpx.Response(200, json=job(NEW_JOB, state=state, exit_code=exit_code))
        if job_id not in self.jobs:
            return httpx.Response(404, json={"detail": f"job {job_id} not found"})
        return httpx.Response(200, json=self.jobs[job_id])

    def _cancel(self, job_id: str) -> httpx.Response:
        if job_id not in self.jobs:
            return httpx.Response(404, json={"detail": f"job {job_id} not found"})
        current = self.jobs[job_id]["state"]
        if current == "succeeded":
            return httpx.Response(409, json={"detail": f"job {job_id} already succeeded"})
        return httpx.Response(202, json={"id": job_id, "state": current, "cancel_requested": True})

    @staticmethod
    def events(job_id: str) -> dict[str, Any]:
        kinds = [
            ("JobSubmitted", "gateway"),
            ("JobAdmitted", "admission"),
            ("JobPlaced", "placement"),
        ]
        return {
            "job_id": job_id,
            "events": [
                {
                    "seq": seq,
                    "id": f"01JEVENT{seq:018d}",
                    "type": kind,
                    "v": 1,
                    "at": f"2026-01-02T03:04:0{seq}Z",
                    "by": by,
                    "data": {"job_id": job_id},
                }
                for seq, (kind, by) in enumerate(kinds, start=1)
            ],
        }

    def last_json(self) -> Any:
        return json.loads(self.requests[-1].content)
