"""NATS JetStream adapter (the only module of the core that imports nats)."""

from gpuloom.bus.deadletters import DeadLetter, DeadLetters
from gpuloom.bus.jetstream import EventBus
from gpuloom.bus.messages import Incoming, Outgoing
from gpuloom.bus.streams import StreamMissingError

__all__ = ["DeadLetter", "DeadLetters", "EventBus", "Incoming", "Outgoing", "StreamMissingError"]
