"""The event schemas evolve only as a log can live with: additive changes, or a new
VERSION with its upcasters (`gpuloom.events.contract`), against the committed
`contracts/events.json`."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from gpuloom.events import json_schemas
from gpuloom.events.contract import breaking_changes, dump

PUBLISHED = Path(__file__).resolve().parents[3] / "contracts" / "events.json"


def published() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(PUBLISHED.read_text())
    return loaded


def test_no_event_changed_in_a_way_a_log_cannot_live_with() -> None:
    assert breaking_changes(published(), json_schemas()) == []


def test_the_committed_schemas_are_the_current_ones() -> None:
    """An additive change is fine, once published: `make contract`, then commit."""
    assert PUBLISHED.read_text() == dump(), "run `make contract` and commit contracts/events.json"


# --- the rules, on a copy of today's schemas -------------------------------------------


@pytest.fixture
def schemas() -> dict[str, Any]:
    return copy.deepcopy(json_schemas())


def spec_of(schemas: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = schemas["JobSubmitted"]["schema"]["$defs"]["JobSpec"]
    return spec


def test_an_optional_field_added_at_any_depth_is_additive(schemas: dict[str, Any]) -> None:
    after = copy.deepcopy(schemas)
    after["JobQueued"]["schema"]["properties"]["hint"] = {"type": "string", "default": ""}
    spec_of(after)["properties"]["checkpoint_dir"] = {"type": "string", "default": ""}
    after["JobQueued"]["schema"]["description"] = "a docstring reworded"
    after["NewThing"] = {"v": 1, "aggregate": "job", "schema": {"type": "object"}}
    assert breaking_changes(schemas, after) == []


def test_a_literal_that_takes_more_values_is_additive_and_one_that_takes_fewer_breaks(
    schemas: dict[str, Any],
) -> None:
    """`Literal["podman"]` becoming `Literal["podman", "kubernetes"]` (a node's runtimes):
    every logged value is still valid. Taking a value away is not."""
    before = copy.deepcopy(schemas)
    spec_of(before)["properties"]["pool"] = {"const": "physical", "type": "string"}
    after = copy.deepcopy(before)
    spec_of(after)["properties"]["pool"] = {"enum": ["physical", "vgpu"], "type": "string"}
    assert breaking_changes(before, after) == []
    assert breaking_changes(after, before) != []
    narrower = copy.deepcopy(after)
    spec_of(narrower)["properties"]["pool"] = {"enum": ["vgpu"], "type": "string"}
    assert breaking_changes(after, narrower) != []


def test_a_removed_field_or_a_new_required_one_breaks(schemas: dict[str, Any]) -> None:
    after = copy.deepcopy(schemas)
    del spec_of(after)["properties"]["command"]
    after["JobQueued"]["schema"]["properties"]["hint"] = {"type": "string"}
    after["JobQueued"]["schema"]["required"].append("hint")
    assert breaking_changes(schemas, after) == [
        "JobQueued v1: hint is required now; raise its VERSION and add an upcaster",
        f"JobSubmitted v{schemas['JobSubmitted']['v']}: spec.command removed; raise its "
        "VERSION and add an upcaster",
    ]


def test_a_narrower_pattern_another_type_or_default_breaks(schemas: dict[str, Any]) -> None:
    after = copy.deepcopy(schemas)
    after["JobQueued"]["schema"]["properties"]["job_id"]["pattern"] = "^[a-z]+$"
    after["JobQueued"]["schema"]["properties"]["priority"]["type"] = "number"
    spec = spec_of(after)
    spec["properties"]["replicas"]["default"] = 2
    found = breaking_changes(schemas, after)
    assert [line.split(":")[0] for line in found] == ["JobQueued v1"] * 2 + [
        f"JobSubmitted v{schemas['JobSubmitted']['v']}"
    ]
    assert "job_id: `pattern`" in found[0] and "priority: `type` 'integer'" in found[1]
    assert "spec.replicas: `default` 1 became 2" in found[2]


def test_a_new_version_needs_an_upcaster_from_each_older_one(schemas: dict[str, Any]) -> None:
    after = copy.deepcopy(schemas)
    after["JobQueued"]["v"] = 3
    del after["JobQueued"]["schema"]["properties"]["priority"]
    assert breaking_changes(schemas, after) == [
        "JobQueued: VERSION 3 without an upcaster from v1 (upcasters.UPCASTERS)",
        "JobQueued: VERSION 3 without an upcaster from v2 (upcasters.UPCASTERS)",
    ]
    upcasters = {("JobQueued", 1): dict, ("JobQueued", 2): dict}
    assert breaking_changes(schemas, after, upcasters) == []


def test_a_type_that_is_gone_or_went_back_breaks(schemas: dict[str, Any]) -> None:
    after = copy.deepcopy(schemas)
    del after["JobQueued"]
    after["JobSubmitted"]["v"] = 1
    before = copy.deepcopy(schemas)
    before["JobSubmitted"]["v"] = 2
    assert breaking_changes(before, after) == [
        "JobQueued: the type is gone, but logs hold it (keep the class)",
        "JobSubmitted: VERSION went back from 2 to 1",
    ]
