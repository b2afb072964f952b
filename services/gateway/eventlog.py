"""The event log as a request reaches it: the bus while NATS is connected. The gateway
connects in the background (`app`), so a request may come while it has no bus yet, or
while NATS is away: a read of the log then answers 503 with Retry-After."""

from __future__ import annotations

from gpuloom.bus import EventBus
from services.gateway.parts import Gateway
from services.gateway.refusals import Refused, answer, unavailable


class EventLog:
    """The bus of one gateway, looked up at each call (it is attached once connected)."""

    __slots__ = ("_gateway",)

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway

    @property
    def connected(self) -> bool:
        """Whether NATS can be reached now."""
        bus = self._gateway.bus
        return bus is not None and bus.connected

    def bus(self) -> EventBus | None:
        """The bus while NATS can be reached, else None."""
        return self._gateway.bus if self.connected else None

    def reachable(self) -> EventBus | Refused:
        """The bus, or the refusal (503 with Retry-After) while NATS cannot be reached."""
        bus = self.bus()
        if bus is None:
            return unavailable("the event log (NATS) is unreachable; retry shortly")
        return bus

    def live(self) -> EventBus:
        """The bus, or 503 with Retry-After raised while NATS cannot be reached."""
        return answer(self.reachable())
