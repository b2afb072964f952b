"""Named, versioned placement policies: the registry configuration picks from."""

from __future__ import annotations

from gpuloom.placement.engine import Policy
from gpuloom.placement.policies import retired_policies, shipped_policies


class PolicyRegistry:
    """Named policies; refuses a duplicate name, names the known ones on a miss.

    Each name has its current version, and may keep earlier ones (`retire`): those
    only re-make recorded decisions (`get` with the version a decision recorded).
    """

    def __init__(self) -> None:
        self._policies: dict[str, Policy] = {}
        self._retired: dict[tuple[str, int], Policy] = {}

    def register(self, policy: Policy) -> None:
        if policy.name in self._policies:
            raise ValueError(f"placement policy {policy.name!r} is already registered")
        self._policies[policy.name] = policy

    def retire(self, policy: Policy) -> None:
        """Keep an earlier version of a registered policy, for `get(name, version)`."""
        current = self.get(policy.name)
        key = (policy.name, policy.version)
        if policy.version >= current.version or key in self._retired:
            raise ValueError(f"placement policy {policy.name!r} v{policy.version} is not retired")
        self._retired[key] = policy

    def get(self, name: str, version: int | None = None) -> Policy:
        """The current `name`, or its earlier `version` when kept (else the current one:
        the caller compares versions and says what differs)."""
        try:
            current = self._policies[name]
        except KeyError:
            known = ", ".join(sorted(self._policies))
            raise KeyError(f"unknown placement policy {name!r} (known: {known})") from None
        if version is None or version == current.version:
            return current
        return self._retired.get((name, version), current)

    def names(self) -> list[str]:
        return sorted(self._policies)


def default_registry() -> PolicyRegistry:
    """The policies gpuloom ships, registered explicitly."""
    registry = PolicyRegistry()
    for policy in shipped_policies():
        registry.register(policy)
    for policy in retired_policies():
        registry.retire(policy)
    return registry
