"""What a placement policy is, and the registry that names them.

A policy is a filter plus a scorer over free GPUs of ready nodes: given one
job's request and the nodes that can host it, it returns the chosen node and
GPU indexes, or None. Scores are integers; ties end on the node name and GPU
index, so every choice is a total order. Policies never read a clock or a
random source: they are pure functions of their arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class FreeGpu:
    index: int
    uuid: str
    model: str


@dataclass(slots=True)
class NodeView:
    """A ready node as the policy sees it during a cycle (free GPUs shrink as it places)."""

    name: str
    total_gpus: int
    free: list[FreeGpu] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Request:
    gpus: int
    gpu_models: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Choice:
    node: str
    gpus: tuple[FreeGpu, ...]


class Policy(Protocol):
    name: str
    version: int

    @property
    def params(self) -> Mapping[str, Any]: ...

    def choose(self, request: Request, nodes: Sequence[NodeView]) -> Choice | None:
        """Pick a node and GPUs for `request` among `nodes` (sorted by name), or None."""
        ...


def eligible_gpus(request: Request, node: NodeView) -> list[FreeGpu]:
    """Free GPUs of `node` whose model the request allows, by index."""
    if not request.gpu_models:
        return node.free
    return [gpu for gpu in node.free if gpu.model in request.gpu_models]


class PolicyRegistry:
    """Named policies; refuses a duplicate name."""

    def __init__(self) -> None:
        self._policies: dict[str, Policy] = {}

    def register(self, policy: Policy) -> None:
        if policy.name in self._policies:
            raise ValueError(f"placement policy {policy.name!r} is already registered")
        self._policies[policy.name] = policy

    def get(self, name: str) -> Policy:
        try:
            return self._policies[name]
        except KeyError:
            known = ", ".join(sorted(self._policies))
            raise KeyError(f"unknown placement policy {name!r} (known: {known})") from None

    def names(self) -> list[str]:
        return sorted(self._policies)
