"""gpuloom: an event-sourced GPU cluster scheduler.

The package is the one shared core of every gpuloom process: the event contract
(`gpuloom.events`), the pure fold (`gpuloom.state`), pure decisions
(`gpuloom.decide`, `gpuloom.placement`) and thin adapters (bus, store, telemetry).
"""

__version__ = "0.1.0"
