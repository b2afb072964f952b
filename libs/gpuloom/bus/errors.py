"""What the bus raises, named here so that code outside `gpuloom.bus` catches it without
importing nats-py (the adapter's library stays behind the port: `gpuloom.bus.port`)."""

from __future__ import annotations

from nats.errors import Error as BusError
from nats.js.errors import BucketNotFoundError as BucketNotFound

#: Every failure of a call over the bus: NATS's own errors, a timeout, a socket that broke.
UNREACHABLE: tuple[type[BaseException], ...] = (BusError, TimeoutError, OSError)

__all__ = ["UNREACHABLE", "BucketNotFound", "BusError"]
