"""Answer log requests: the tail of a job's stdout and stderr on one node.

Request: `gpuloom.events.logs.LogsRequest` (JSON, a core NATS request on
`agent_logs_subject(node)`). Reply: `{"job_id", "found", "attempt", "replica", "attempts", "stdout", "stderr"}` for
the replica's given attempt on this node (null: its latest, the highest attempt
folder), decoded as UTF-8 with errors replaced; `attempts` lists the replica's
attempts this node holds. `found` is false and `attempt` null when the node never
ran that attempt of that replica.
A malformed request gets `{"error": "..."}`. The reply never exceeds
`max_payload`: the tails are shortened until it fits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from gpuloom.events.logs import LogsRequest
from services.agent.shim import RunDir, parse_run_leaf


def attempts_of(root: Path, node: str, job_id: str, replica: int = 0) -> list[int]:
    """The attempts of `replica` of `job_id` that have a run folder on `node`, in order."""
    try:
        leaves = [parse_run_leaf(p.name) for p in (root / node / job_id).iterdir()]
    except OSError:
        return []
    return sorted(leaf[0] for leaf in leaves if leaf is not None and leaf[1] == replica)


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


def job_logs(
    root: Path,
    node: str,
    job_id: str,
    tail_bytes: int,
    replica: int = 0,
    attempt: int | None = None,
) -> dict[str, Any]:
    """The reply for one replica's attempt of one job (see module doc)."""
    attempts = attempts_of(root, node, job_id, replica)
    chosen = max(attempts, default=None) if attempt is None else attempt
    reply: dict[str, Any] = {"job_id": job_id, "replica": replica, "attempts": attempts}
    if chosen is None or chosen not in attempts:
        return {**reply, "found": False, "attempt": None, "stdout": "", "stderr": ""}
    run = RunDir(root, node, job_id, chosen, replica).path
    return {
        **reply,
        "found": True,
        "attempt": chosen,
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
        logs = job_logs(root, node, parsed.job_id, size, parsed.replica, parsed.attempt)
        reply = orjson.dumps(logs)
        if len(reply) <= max_payload or size == 0:
            return reply
        size //= 2
