"""`GpuloomClient` on its own: URL resolution, error messages, transport failures."""

from __future__ import annotations

import socket

import httpx
import pytest

from gpuloom.client import (
    DEFAULT_GATEWAY_URL,
    ApiError,
    GatewayUnreachableError,
    GpuloomClient,
    resolve_gateway_url,
)


@pytest.mark.parametrize(
    ("url", "env", "expected"),
    [
        (None, {}, DEFAULT_GATEWAY_URL),
        (None, {"GPULOOM_GATEWAY_PORT": "9000"}, "http://127.0.0.1:9000"),
        (
            None,
            {"GPULOOM_GATEWAY_URL": "http://gw:80/", "GPULOOM_GATEWAY_PORT": "9"},
            "http://gw:80",
        ),
        ("http://cli:1", {"GPULOOM_GATEWAY_URL": "http://gw:80"}, "http://cli:1"),
    ],
    ids=[
        "nothing set gives the default",
        "a port alone gives loopback on that port",
        "the URL variable wins over the port",
        "the option wins over the environment",
    ],
)
def test_resolve_gateway_url(url: str | None, env: dict[str, str], expected: str) -> None:
    assert resolve_gateway_url(url, env) == expected


def client_answering(response: httpx.Response) -> GpuloomClient:
    return GpuloomClient("http://gw", transport=httpx.MockTransport(lambda request: response))


def test_validation_errors_are_flattened_to_one_line() -> None:
    detail = [
        {"loc": ["body", "gpus"], "msg": "Input should be greater than or equal to 0"},
        {"loc": ["body", "command"], "msg": "Field required"},
    ]
    client = client_answering(httpx.Response(422, json={"detail": detail}))

    with pytest.raises(ApiError) as caught:
        client.submit(name="x", user="u", account="a", command=["true"], gpus=-1)

    assert caught.value.status == 422
    assert str(caught.value) == (
        "gpus: Input should be greater than or equal to 0; command: Field required (HTTP 422)"
    )


def test_a_503_carries_retry_after() -> None:
    response = httpx.Response(
        503, json={"detail": "the event log is unreachable"}, headers={"Retry-After": "2"}
    )

    with pytest.raises(ApiError) as caught:
        client_answering(response).list_jobs()

    assert caught.value.retry_after_s == 2.0
    assert str(caught.value) == "the event log is unreachable (HTTP 503); retry after 2 s"


def test_a_body_without_detail_is_quoted() -> None:
    with pytest.raises(ApiError, match=r"^Bad Gateway \(HTTP 502\)$"):
        client_answering(httpx.Response(502, text="Bad Gateway")).nodes()


def test_a_timeout_names_the_gateway() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    client = GpuloomClient("http://gw", timeout=3, transport=httpx.MockTransport(slow))
    with pytest.raises(
        GatewayUnreachableError,
        match=r"^cannot reach the gateway at http://gw: no answer within 3 s",
    ):
        client.health()


def test_a_closed_port_is_unreachable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again when the block ends

    with (
        GpuloomClient(f"http://127.0.0.1:{port}", timeout=2) as client,
        pytest.raises(
            GatewayUnreachableError, match=f"cannot reach the gateway at http://127.0.0.1:{port}"
        ),
    ):
        client.health()


def test_job_ids_are_one_path_segment() -> None:
    seen: list[str] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.raw_path.decode())
        return httpx.Response(200, json={})

    GpuloomClient("http://gw", transport=httpx.MockTransport(record)).get_job("a/b")

    assert seen == ["/v1/jobs/a%2Fb"]
