"""What the Kubernetes API answers when it refuses: `ApiError` and the three refusals a
caller acts on (`NotFound`, `Conflict`, `Gone`)."""

from __future__ import annotations

from typing import Any


class KubeConfigError(ValueError):
    """A kubeconfig (or the in-cluster service account) that cannot be used."""


class ApiError(Exception):
    """A request the API server refused: its HTTP `status`, the `reason` of its Status
    object (`NotFound`, `AlreadyExists`, `Conflict`, `Expired`, ...) and its message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class NotFound(ApiError):
    """404: the object (or the namespace) is not there."""


class Conflict(ApiError):
    """409: a stale resourceVersion, an object that already exists (`AlreadyExists`), or
    a Binding of a pod already bound (or whose UID no longer matches)."""


class Gone(ApiError):
    """410: the resourceVersion a watch started from is too old; list again."""


_BY_STATUS: dict[int, type[ApiError]] = {404: NotFound, 409: Conflict, 410: Gone}


def api_error(status: int, body: Any) -> ApiError:
    """The error of an HTTP `status` whose body is `body` (a Status object when the API
    server wrote it, else anything: a proxy's text, nothing)."""
    reason, message = "", ""
    if isinstance(body, dict):
        reason = str(body.get("reason") or "")
        message = str(body.get("message") or "")
    elif body:
        message = str(body)[:500]
    return _BY_STATUS.get(status, ApiError)(status, reason or _default_reason(status), message)


def status_error(status: dict[str, Any]) -> ApiError:
    """The error of a Status object sent as a watch's ERROR event (its `code` is the
    HTTP status it stands for: 410 when the watch's resourceVersion is too old)."""
    code = status.get("code")
    return api_error(int(code) if isinstance(code, int) else 500, status)


def _default_reason(status: int) -> str:
    return {404: "NotFound", 409: "Conflict", 410: "Gone"}.get(status, f"HTTP{status}")
