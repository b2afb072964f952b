"""NATS JetStream adapter (the only module of the core that imports nats)."""

from gpuloom.bus.jetstream import EventBus, Incoming, Outgoing

__all__ = ["EventBus", "Incoming", "Outgoing"]
