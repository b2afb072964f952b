"""What the webhook integration tests share: registering a webhook and waiting."""

from __future__ import annotations

import time
from typing import Any


def wait_until(check: Any, timeout: float = 30.0, every_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(every_s)


def register(client: Any, **body: Any) -> dict[str, Any]:
    answer = client.post("/v1/webhooks", json=body)
    assert answer.status_code == 201, answer.text
    created: dict[str, Any] = answer.json()
    return created
