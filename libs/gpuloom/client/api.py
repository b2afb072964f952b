"""A small, typed, synchronous client of the gateway's REST API (`/v1`).

Contract:
- one method per endpoint; each returns the decoded JSON body unchanged
  (typed by `gpuloom.client.schema`);
- a 4xx/5xx answer raises `ApiError(status, detail)` carrying the server's
  `detail` message (FastAPI validation lists are flattened to one line);
- a gateway that cannot be reached (refused, DNS, timeout) raises
  `GatewayUnreachableError`, whose message names the URL;
- no retries: the caller decides (a 503 carries `retry_after_s` when the
  gateway sent `Retry-After`);
- a `token` is sent as `Authorization: Bearer`; a 401 (no token, or one the
  gateway refuses) and a 403 (an act the token's user may not do) raise an
  `ApiError` whose message says which, and what to do.

A `transport` can be injected (tests use `httpx.MockTransport`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Self, cast
from urllib.parse import quote

import httpx

from gpuloom.client.errors import ApiError, GatewayUnreachableError, error_from_response
from gpuloom.client.schema import (
    AccountList,
    CancelAnswer,
    DeadLetterList,
    Health,
    Job,
    JobEvents,
    JobExplanation,
    JobList,
    JobLogs,
    LimitsList,
    NodeList,
    PriorityClassList,
    Queue,
    Reservation,
    ReservationList,
    SubmitAnswer,
    Usage,
    UsageRecords,
)

DEFAULT_GATEWAY_HOST = "127.0.0.1"
DEFAULT_GATEWAY_PORT = 8080
DEFAULT_GATEWAY_URL = f"http://{DEFAULT_GATEWAY_HOST}:{DEFAULT_GATEWAY_PORT}"
DEFAULT_TIMEOUT_S = 10.0
#: A stream silent this long (no event, no keep-alive comment) is taken for dead.
STREAM_SILENCE_S = 60.0


def resolve_gateway_url(url: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The gateway URL: `url`, else `GPULOOM_GATEWAY_URL`, else `GPULOOM_GATEWAY_PORT`
    on 127.0.0.1, else `DEFAULT_GATEWAY_URL`. Raises `ValueError` on a bad port."""
    env = os.environ if env is None else env
    chosen = url or env.get("GPULOOM_GATEWAY_URL")
    if chosen:
        return chosen.rstrip("/")
    port = env.get("GPULOOM_GATEWAY_PORT")
    if port:
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"GPULOOM_GATEWAY_PORT={port!r} is not a TCP port")
        return f"http://{DEFAULT_GATEWAY_HOST}:{int(port)}"
    return DEFAULT_GATEWAY_URL


class GpuloomClient:
    """Client of one gateway. Use as a context manager, or call `close()`."""

    def __init__(
        self,
        base_url: str = DEFAULT_GATEWAY_URL,
        timeout: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
        token: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        headers = {"Authorization": f"Bearer {token}"} if token else None
        self._http = httpx.Client(
            base_url=self.base_url, timeout=timeout, transport=transport, headers=headers
        )
        #: Why the last read's answer was stale (`Gpuloom-Stale`: the gateway was still
        #: catching up with the log), with its lag; None: it was current.
        self.stale: str | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- transport ---------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """Send one request; the decoded JSON body of a 2xx answer, else raise."""
        try:
            response = self._http.request(method, path, params=params, json=json, headers=headers)
        except httpx.TimeoutException as exc:
            raise GatewayUnreachableError(
                self.base_url, f"no answer within {self.timeout:g} s ({type(exc).__name__})"
            ) from exc
        except (httpx.TransportError, httpx.InvalidURL) as exc:
            raise GatewayUnreachableError(self.base_url, str(exc) or type(exc).__name__) from exc
        if "gpuloom-stale" in response.headers:
            lag = response.headers.get("gpuloom-projection-lag")
            behind = f", {lag} events behind the log" if lag is not None else ""
            self.stale = f"{response.headers['gpuloom-stale']}{behind}"
        if response.is_error:
            raise error_from_response(response)
        if response.status_code == 204:  # No Content: a deletion
            return None
        try:
            return response.json()
        except ValueError as exc:
            raise ApiError(
                response.status_code, "the gateway sent a body that is not JSON"
            ) from exc

    @contextmanager
    def stream(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Iterator[httpx.Response]:
        """An answer read as it comes (`GET /v1/events`, `gpuloom.client.watch`): no
        total timeout; one minute without a byte is a dead connection (the gateway
        sends a comment every 15 s)."""
        timeout = httpx.Timeout(self.timeout, read=STREAM_SILENCE_S)
        try:
            with self._http.stream(
                method, path, params=params, headers=headers, timeout=timeout
            ) as response:
                yield response
        except httpx.TimeoutException as exc:
            raise GatewayUnreachableError(
                self.base_url, f"the stream went silent ({type(exc).__name__})"
            ) from exc

    # -- jobs --------------------------------------------------------------

    def submit(
        self,
        *,
        name: str,
        user: str | None = None,
        account: str,
        command: list[str],
        gpus: int = 0,
        gpu_model: list[str] | None = None,
        priority: int | None = None,
        priority_class: str | None = None,
        time_limit_s: int | None = None,
        env: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        resources: Mapping[str, Any] | None = None,
    ) -> SubmitAnswer:
        """`POST /v1/jobs`. The same `idempotency_key` sent twice yields one job.

        `user` None: the token's user (only an operator may name another);
        `priority_class` None: the default class; `priority` None: the class's.
        `resources` carries the optional request fields (gpu_milli, gpu_memory_mib,
        cpu_milli, memory_mib, pool, locality, node_selector, replicas, image, preemptible,
        reservation...); None values are left out so the gateway's defaults apply.
        """
        body: dict[str, Any] = {
            "name": name,
            "account": account,
            "command": list(command),
            "gpus": gpus,
        }
        if priority is not None:
            body["priority"] = priority
        if priority_class is not None:
            body["priority_class"] = priority_class
        if user is not None:
            body["user"] = user
        if gpu_model:
            body["gpu_model"] = list(gpu_model)
        if time_limit_s is not None:
            body["time_limit_s"] = time_limit_s
        if env:
            body["env"] = dict(env)
        body.update({k: v for k, v in (resources or {}).items() if v is not None})
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return cast(SubmitAnswer, self._request("POST", "/v1/jobs", json=body, headers=headers))

    def list_jobs(
        self,
        *,
        state: str | None = None,
        user: str | None = None,
        account: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
        order: str | None = None,
    ) -> JobList:
        """`GET /v1/jobs`, filtered by the arguments that are not None."""
        given = {
            "state": state, "user": user, "account": account, "limit": limit,
            "offset": offset, "order": order,
        }  # fmt: skip
        params = {key: value for key, value in given.items() if value is not None}
        return cast(JobList, self._request("GET", "/v1/jobs", params=params))

    def accounts(self) -> AccountList:
        """`GET /v1/accounts`."""
        return cast(AccountList, self._request("GET", "/v1/accounts"))

    def create_account(
        self, name: str, parent: str | None, shares: int, description: str = ""
    ) -> dict[str, Any]:
        """`POST /v1/accounts`."""
        body = {"name": name, "parent": parent, "shares": shares, "description": description}
        return cast(dict[str, Any], self._request("POST", "/v1/accounts", json=body))

    def set_shares(self, name: str, shares: int) -> dict[str, Any]:
        """`PUT /v1/accounts/{name}/shares`."""
        path = f"/v1/accounts/{_segment(name)}/shares"
        return cast(dict[str, Any], self._request("PUT", path, json={"shares": shares}))

    def set_users(self, name: str, users: list[str]) -> dict[str, Any]:
        """`PUT /v1/accounts/{name}/users` (an empty list lets anyone submit)."""
        path = f"/v1/accounts/{_segment(name)}/users"
        return cast(dict[str, Any], self._request("PUT", path, json={"users": users}))

    def set_coordinators(self, name: str, coordinators: list[str]) -> dict[str, Any]:
        """`PUT /v1/accounts/{name}/coordinators` (operators; an empty list names none)."""
        path = f"/v1/accounts/{_segment(name)}/coordinators"
        body = {"coordinators": coordinators}
        return cast(dict[str, Any], self._request("PUT", path, json=body))

    def set_quota(
        self,
        name: str,
        resource: str,
        nominal: int | None,
        borrowing_limit: int | None = None,
        cap: int | None = None,
    ) -> dict[str, Any]:
        """`PUT /v1/accounts/{name}/quota` (nominal None removes the quota of `resource`)."""
        path = f"/v1/accounts/{_segment(name)}/quota"
        body = {
            "resource": resource,
            "nominal": nominal,
            "borrowing_limit": borrowing_limit,
            "cap": cap,
        }
        return cast(dict[str, Any], self._request("PUT", path, json=body))

    # -- policies (priority classes, limits) -----------------------------------

    def call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """Any other route: `method` on `path` (segments already quoted), the JSON answer."""
        return cast(dict[str, Any], self._request(method, path, json=body))

    def queue(self) -> Queue:
        """`GET /v1/queue`: pending jobs in order with their priority factors."""
        return cast(Queue, self._request("GET", "/v1/queue"))

    def priority_classes(self) -> PriorityClassList:
        """GET /v1/priority-classes: every class a job may name, and the default."""
        return cast(PriorityClassList, self._request("GET", "/v1/priority-classes"))

    def set_priority_class(self, name: str, body: dict[str, Any]) -> PriorityClassList:
        """PUT /v1/priority-classes/{name} (operators): the classes after the change."""
        path = f"/v1/priority-classes/{_segment(name)}"
        return cast(PriorityClassList, self._request("PUT", path, json=body))

    def delete_priority_class(self, name: str) -> PriorityClassList:
        """DELETE /v1/priority-classes/{name} (operators): the classes left."""
        path = f"/v1/priority-classes/{_segment(name)}"
        return cast(PriorityClassList, self._request("DELETE", path))

    def limits(self) -> LimitsList:
        """GET /v1/limits: every user's and account's limits."""
        return cast(LimitsList, self._request("GET", "/v1/limits"))

    def set_limits(self, scope: str, name: str, body: dict[str, Any]) -> LimitsList:
        """PUT /v1/limits/{scope}/{name} (operators): every limit after the change."""
        path = f"/v1/limits/{_segment(scope)}/{_segment(name)}"
        return cast(LimitsList, self._request("PUT", path, json=body))

    # -- advance reservations ------------------------------------------------

    def reservations(self) -> ReservationList:
        """GET /v1/reservations: every reservation that has not ended."""
        return cast(ReservationList, self._request("GET", "/v1/reservations"))

    def reservation(self, name: str) -> Reservation:
        """GET /v1/reservations/{name}."""
        path = f"/v1/reservations/{_segment(name)}"
        return cast(Reservation, self._request("GET", path))

    def create_reservation(self, body: dict[str, Any]) -> Reservation:
        """POST /v1/reservations (operators): the reservation as the log has it."""
        return cast(Reservation, self._request("POST", "/v1/reservations", json=body))

    def update_reservation(self, name: str, body: dict[str, Any]) -> Reservation:
        """PATCH /v1/reservations/{name} (operators): each field given replaces its own."""
        path = f"/v1/reservations/{_segment(name)}"
        return cast(Reservation, self._request("PATCH", path, json=body))

    def delete_reservation(self, name: str) -> None:
        """DELETE /v1/reservations/{name} (operators): its waiting jobs are cancelled."""
        self._request("DELETE", f"/v1/reservations/{_segment(name)}")

    def explain(self, job_id: str) -> JobExplanation:
        """`GET /v1/jobs/{id}/explain`: why the job is pending."""
        return cast(JobExplanation, self._request("GET", f"/v1/jobs/{_segment(job_id)}/explain"))

    def get_job(self, job_id: str) -> Job:
        """`GET /v1/jobs/{id}`; 404 raises `ApiError`."""
        return cast(Job, self._request("GET", f"/v1/jobs/{_segment(job_id)}"))

    def cancel_job(self, job_id: str) -> CancelAnswer:
        """`DELETE /v1/jobs/{id}`: asks for cancellation; 409 when the job is already final."""
        return cast(CancelAnswer, self._request("DELETE", f"/v1/jobs/{_segment(job_id)}"))

    def job_events(self, job_id: str) -> JobEvents:
        """`GET /v1/jobs/{id}/events`: the job's events in log order."""
        return cast(JobEvents, self._request("GET", f"/v1/jobs/{_segment(job_id)}/events"))

    def job_logs(
        self,
        job_id: str,
        tail_bytes: int | None = None,
        replica: int = 0,
        attempt: int | None = None,
    ) -> JobLogs:
        """`GET /v1/jobs/{id}/logs` (replica 0's last attempt unless told); 503 when the
        agent of the node it ran on does not answer."""
        given = {"tail_bytes": tail_bytes, "replica": replica or None, "attempt": attempt}
        params = {name: value for name, value in given.items() if value is not None}
        return cast(
            JobLogs, self._request("GET", f"/v1/jobs/{_segment(job_id)}/logs", params=params)
        )

    # -- cluster -----------------------------------------------------------

    def nodes(self) -> NodeList:
        """`GET /v1/nodes`."""
        return cast(NodeList, self._request("GET", "/v1/nodes"))

    def cordon(self, node: str, reason: str = "") -> dict[str, Any]:
        """`POST /v1/nodes/{node}/cordon`: nothing new lands on the node."""
        path = f"/v1/nodes/{_segment(node)}/cordon"
        return cast(dict[str, Any], self._request("POST", path, json={"reason": reason}))

    def remove_node(self, node: str, reason: str = "") -> dict[str, Any]:
        """`DELETE /v1/nodes/{node}`: a node gone for good leaves the cluster (operators)."""
        params = {"reason": reason} if reason else None
        path = f"/v1/nodes/{_segment(node)}"
        return cast(dict[str, Any], self._request("DELETE", path, params=params))

    def resume_gpu(self, node: str, index: int, reason: str = "") -> dict[str, Any]:
        """`POST /v1/nodes/{node}/gpus/{index}/resume`: a failed GPU back in service."""
        path = f"/v1/nodes/{_segment(node)}/gpus/{index}/resume"
        return cast(dict[str, Any], self._request("POST", path, json={"reason": reason}))

    def uncordon(self, node: str) -> dict[str, Any]:
        """`DELETE /v1/nodes/{node}/cordon`."""
        return cast(dict[str, Any], self._request("DELETE", f"/v1/nodes/{_segment(node)}/cordon"))

    def usage(self, since: str | None = None, until: str | None = None) -> Usage:
        """`GET /v1/usage`: GPU time per account, per user and per GPU model."""
        return cast(Usage, self._request("GET", "/v1/usage", params=_window(since, until)))

    def usage_records(
        self, since: str | None = None, until: str | None = None, **filters: str
    ) -> UsageRecords:
        """`GET /v1/usage/jobs`: one record per charged run (like sacct)."""
        params = {**_window(since, until), **{k: v for k, v in filters.items() if v}}
        return cast(UsageRecords, self._request("GET", "/v1/usage/jobs", params=params))

    def usage_csv(
        self, what: str, group_by: str, since: str | None = None, until: str | None = None
    ) -> str:
        """The usage report (`what` = "usage") or the records (`"jobs"`) as CSV text."""
        path = "/v1/usage" if what == "usage" else "/v1/usage/jobs"
        params = {**_window(since, until), "group_by": group_by, "format": "csv"}
        try:
            response = self._http.get(path, params=params)
        except (httpx.TransportError, httpx.InvalidURL) as exc:
            raise GatewayUnreachableError(self.base_url, str(exc) or type(exc).__name__) from exc
        if response.is_error:
            raise error_from_response(response)
        return response.text

    def health(self) -> Health:
        """`GET /healthz`."""
        return cast(Health, self._request("GET", "/healthz"))

    def dead_letters(self, limit: int = 50) -> DeadLetterList:
        """`GET /v1/deadletters`: messages the services could not handle, newest first."""
        return cast(
            DeadLetterList, self._request("GET", "/v1/deadletters", params={"limit": limit})
        )


def _window(since: str | None, until: str | None) -> dict[str, str]:
    return {k: v for k, v in (("since", since), ("until", until)) if v}


def _segment(value: str) -> str:
    """`value` as one URL path segment (a job id never holds '/', but a typo might)."""
    return quote(value, safe="")
