"""v1 -> v2: old payloads brought within the contract of `gpuloom.events.text`.

Version 2 of JobSubmitted, NodeRegistered, AccountCreated, AccountUsersSet and
NodeCordoned narrowed what their strings and integers may hold (to what storage, the
bus and `exec` hold). A log
written before holds v1 events that the old contract accepted (`"user": "John
Doe"`, an account `ml.team`, a NUL in an env value, a time limit of 3e11): read
strictly they would be malformed, their jobs and nodes lost on replay. These
upcasters keep every such fact, with each value made the closest one the new
contract holds: a blank or control character becomes `_`, an unprintable one `?`,
a NUL is dropped, a string is cut to its column, an integer clamped to its type.
Pure functions of the payload, so every reader upcasts the same way.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from gpuloom.events.text import EXEC_WORD_BYTES, INT32_MAX

Payload = dict[str, Any]

_NOT_TOKEN = re.compile(r"[^A-Za-z0-9_\-]")


def printable(value: Any, limit: int) -> str:
    """`value` as text a `Remark` holds: control characters `?`, cut to `limit`."""
    text = "".join("?" if unicodedata.category(ch)[0] == "C" else ch for ch in str(value))
    return text[:limit]


def _word(value: Any, limit: int) -> str:
    text = "".join(
        "_" if ch.isspace() or unicodedata.category(ch)[0] == "C" else ch for ch in str(value)
    )
    return text[:limit] or "_"


def _token(value: Any) -> str:
    text = _NOT_TOKEN.sub("-", str(value))
    if not text or not text[0].isalnum():
        text = "x" + text
    return text[:63]


def _exec(value: Any) -> str:
    raw = str(value).replace("\0", "").encode()[:EXEC_WORD_BYTES]
    return raw.decode(errors="ignore")


def _clamp(value: Any, high: int) -> Any:
    return min(value, high) if isinstance(value, int) else value


def _labels(labels: Any) -> dict[str, str]:
    if not isinstance(labels, dict):
        return {}
    return {_word(k, 253): printable(v, 253) for k, v in list(labels.items())[:64]}


def job_spec(spec: Payload) -> Payload:
    spec = dict(spec)
    for key, limit in (("name", 200),):
        if key in spec:
            spec[key] = printable(spec[key], limit) or "_"
    if "user" in spec:
        spec["user"] = _word(spec["user"], 100)
    if "account" in spec:
        spec["account"] = _token(spec["account"])
    if isinstance(spec.get("command"), list):
        spec["command"] = [_exec(word) for word in spec["command"][:4096]]
    if isinstance(spec.get("env"), dict):
        env = {}
        for name, value in list(spec["env"].items())[:1024]:
            clean = printable(str(name).replace("=", "_").replace("\0", ""), 256)
            if clean:
                env[clean] = _exec(value)
        spec["env"] = env
    if isinstance(spec.get("gpu_model"), list):
        spec["gpu_model"] = [_word(m, 100) for m in spec["gpu_model"][:64]]
    if "node_selector" in spec:
        spec["node_selector"] = _labels(spec["node_selector"])
    for key in ("time_limit_s", "cpu_milli", "memory_mib", "gpu_memory_mib"):
        if key in spec:
            spec[key] = _clamp(spec[key], INT32_MAX)
    if isinstance(spec.get("depends_on"), list):
        spec["depends_on"] = [
            {**d, "job": _token(d["job"])} if isinstance(d, dict) and "job" in d else d
            for d in spec["depends_on"]
        ]
    return spec


def job_submitted(payload: Payload) -> Payload:
    payload = dict(payload)
    if isinstance(payload.get("spec"), dict):
        payload["spec"] = job_spec(payload["spec"])
    key = payload.get("idempotency_key")
    if isinstance(key, str):
        payload["idempotency_key"] = "".join(ch if "!" <= ch <= "~" else "_" for ch in key)[:200]
    return payload


def node_registered(payload: Payload) -> Payload:
    payload = dict(payload)
    spec = payload.get("spec")
    if isinstance(spec, dict):
        spec = dict(spec)
        if isinstance(spec.get("gpus"), list):
            spec["gpus"] = [
                {
                    **gpu,
                    "uuid": _word(gpu.get("uuid", ""), 100),
                    "model": _word(gpu.get("model", ""), 100),
                    "memory_mib": _clamp(gpu.get("memory_mib", 0), INT32_MAX),
                }
                if isinstance(gpu, dict)
                else gpu
                for gpu in spec["gpus"]
            ]
        if "labels" in spec:
            spec["labels"] = _labels(spec["labels"])
        if "cpu_milli" in spec:
            spec["cpu_milli"] = _clamp(spec["cpu_milli"], INT32_MAX)
        payload["spec"] = spec
    return payload


def remark(field: str) -> Any:
    """The upcaster of an event whose free-text `field` is now a printable Remark."""

    def step(payload: Payload) -> Payload:
        if field not in payload:
            return payload
        return {**payload, field: printable(payload[field], 500)}

    return step


def account_users(payload: Payload) -> Payload:
    users = payload.get("users")
    if not isinstance(users, list):
        return payload
    return {**payload, "users": [_word(user, 100) for user in users]}
