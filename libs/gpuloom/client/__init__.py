"""REST client of the gpuloom gateway and the `gpuloom` command line.

`GpuloomClient` is a thin, synchronous, typed wrapper over the gateway's `/v1`
API; `gpuloom.client.cli` is the `gpuloom` console script built on it.
"""

from gpuloom.client.api import DEFAULT_GATEWAY_URL, GpuloomClient, resolve_gateway_url
from gpuloom.client.errors import ApiError, ClientError, GatewayUnreachableError

__all__ = [
    "DEFAULT_GATEWAY_URL",
    "ApiError",
    "ClientError",
    "GatewayUnreachableError",
    "GpuloomClient",
    "resolve_gateway_url",
]
