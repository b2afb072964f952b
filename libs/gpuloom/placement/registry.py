"""Named, versioned placement policies: the registry configuration picks from."""

from __future__ import annotations

from gpuloom.placement.engine import Policy
from gpuloom.placement.policies import shipped_policies


class PolicyRegistry:
    """Named policies; refuses a duplicate name, names the known ones on a miss."""

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


def default_registry() -> PolicyRegistry:
    """The policies gpuloom ships, registered explicitly."""
    registry = PolicyRegistry()
    for policy in shipped_policies():
        registry.register(policy)
    return registry
