"""`gpuloom serve NAME`: run one service process in the foreground.

Contract with `services/<name>/__main__.py`: the module exposes
`entrypoint(args: list[str]) -> None`, which runs the process until it is
stopped (SIGTERM/SIGINT) and parses its own extra arguments.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import cast

#: Every process `gpuloom serve` can run, in pipeline order.
SERVICES: tuple[str, ...] = (
    "gateway",
    "projector",
    "admission",
    "queue",
    "placement",
    "dispatch",
    "inventory",
    "accounting",
    "webhooks",
    "agent",
    "extender",
    "kubewatch",
)

Entrypoint = Callable[[list[str]], None]


class UnknownServiceError(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(f"unknown service {name!r}; choose one of: {', '.join(SERVICES)}")


class ServiceLoadError(RuntimeError):
    """The service's module could not be imported or has no `entrypoint`."""


def load_entrypoint(name: str) -> Entrypoint:
    """The `entrypoint` of `services.<name>.__main__`; raises on an unknown or broken service."""
    if name not in SERVICES:
        raise UnknownServiceError(name)
    module_name = f"services.{name}.__main__"
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ServiceLoadError(f"cannot load service {name!r} ({module_name}): {exc}") from exc
    entrypoint = getattr(module, "entrypoint", None)
    if not callable(entrypoint):
        raise ServiceLoadError(f"{module_name} has no entrypoint(args) function")
    return cast(Entrypoint, entrypoint)
