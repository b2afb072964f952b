"""Answer log requests: the tail of a job's stdout and stderr on one node.

Request (JSON, core NATS request on `agent_logs_subject(node)`):
`{"job_id": str, "tail_bytes": int = 65536}`.
Reply: `{"job_id", "found", "attempt", "stdout", "stderr"}` for the job's latest
attempt on this node (the highest attempt folder), decoded as UTF-8 with errors
replaced; `found` is false and `attempt` null when the node never ran the job.
A malformed request gets `{"error": "..."}`. The reply never exceeds
`max_payload`: the tails are shortened until it fits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuloom.events.base import SUBJECT_TOKEN

DEFAULT_TAIL = 65536
MAX_TAIL = 4 * 1024 * 1024


class LogsRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str = Field(pattern=SUBJECT_TOKEN.pattern)  # also keeps paths inside the root
    tail_bytes: int = Field(default=DEFAULT_TAIL, ge=0, le=MAX_TAIL)


def latest_attempt(root: Path, node: str, job_id: str) -> int | None:
    """The highest attempt that has a run folder for `job_id` on `node`."""
    try:
        attempts = [int(p.name) for p in (root / node / job_id).iterdir() if p.name.isdigit()]
    except OSError:
        return None
    return max(attempts, default=None)


def tail(path: Path, size: int) -> str:
    """The last `size` bytes of a file as text ('' if missing)."""
    if size <= 0:
        return ""
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            length = handle.tell()
            handle.seek(max(0, length - size))
            data = handle.read(size)
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")


def job_logs(root: Path, node: str, job_id: str, tail_bytes: int) -> dict[str, Any]:
    """The reply for one job (see module doc)."""
    attempt = latest_attempt(root, node, job_id)
    if attempt is None:
        return {"job_id": job_id, "found": False, "attempt": None, "stdout": "", "stderr": ""}
    run = root / node / job_id / str(attempt)
    return {
        "job_id": job_id,
        "found": True,
        "attempt": attempt,
        "stdout": tail(run / "stdout", tail_bytes),
        "stderr": tail(run / "stderr", tail_bytes),
    }


def answer(root: Path, node: str, request: bytes, max_payload: int = 1024 * 1024) -> bytes:
    """The encoded reply to one raw request, at most `max_payload` bytes."""
    try:
        parsed = LogsRequest.model_validate_json(request or b"{}")
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'request'}: {e['msg']}" for e in exc.errors()
        )
        return orjson.dumps({"error": f"malformed logs request: {problems}"})
    size = parsed.tail_bytes
    while True:
        reply = orjson.dumps(job_logs(root, node, parsed.job_id, size))
        if len(reply) <= max_payload or size == 0:
            return reply
        size //= 2
