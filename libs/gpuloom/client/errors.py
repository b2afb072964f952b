"""What the gateway's client raises: one base class, whose `str()` is a one-line
message for people, and the `ApiError` made from a 4xx/5xx answer (the server's
`detail` flattened to one line, what to do about a 401, `Retry-After`)."""

from __future__ import annotations

from typing import Any

import httpx


class ClientError(Exception):
    """Base of every error the client raises; `str()` is a one-line message for people."""


class GatewayUnreachableError(ClientError):
    """No HTTP answer came back from the gateway."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot reach the gateway at {url}: {reason}")
        self.url = url
        self.reason = reason


class ApiError(ClientError):
    """The gateway answered with a 4xx or 5xx status."""

    def __init__(self, status: int, detail: str, retry_after_s: float | None = None) -> None:
        message = f"{detail} (HTTP {status})"
        if retry_after_s is not None:
            message += f"; retry after {retry_after_s:g} s"
        super().__init__(message)
        self.status = status
        self.detail = detail
        self.retry_after_s = retry_after_s


def _format_detail(detail: Any) -> str:
    """One line from a FastAPI `detail`: a string, or a list of validation errors."""
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):
        parts = []
        for item in detail:
            if isinstance(item, dict) and "msg" in item:
                loc = ".".join(str(p) for p in item.get("loc", []) if p != "body")
                parts.append(f"{loc}: {item['msg']}" if loc else str(item["msg"]))
            else:
                parts.append(str(item))
        return "; ".join(parts) or "invalid request"
    return str(detail)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


#: What to do about a 401.
TOKEN_HINT = (
    "set GPULOOM_TOKEN, or save a token in ~/.config/gpuloom/token "
    "(an operator makes one with `gpuloom token issue --user NAME`)"
)


def error_from_response(response: httpx.Response) -> ApiError:
    """The `ApiError` for a 4xx/5xx answer, with the server's `detail` when it sent one."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "detail" in body:
        detail = _format_detail(body["detail"])
    else:
        detail = response.text.strip()[:200] or response.reason_phrase or "error"
    if response.status_code == 401:
        detail = f"not authenticated: {detail}; {TOKEN_HINT}"
    elif response.status_code == 403:
        detail = f"not allowed: {detail}"
    return ApiError(response.status_code, detail, _retry_after(response))
