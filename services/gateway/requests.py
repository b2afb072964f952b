"""The bodies the gateway accepts for a job: what a client sends, apart from the routes
that take it (POST /v1/jobs, POST /v1/job-batches) and from the policy that checks it
(`submit_policy`), which both name it.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from gpuloom.events import JobSpec
from gpuloom.events.policies import PRIORITY_MAX, PRIORITY_MIN
from gpuloom.events.text import LOADER_ENV_ALLOWED, RESERVED_ENV_PATTERN, UserName


def _what_jobspec_checks(schema: dict[str, Any]) -> None:
    """Say in the request's schema what JobSpec checks beyond its fields' types:
    `command[0]` is not empty; `env` sets no variable the scheduler sets (`_check_env`);
    a fraction (`gpu_milli`) needs `gpus >= 1` and is not from the physical pool;
    `gpu_memory_mib` needs `gpu_milli`. (The cluster's MaxTime is a setting: apidocs.)"""
    command = schema["properties"]["command"]
    command["prefixItems"] = [{**command["items"], "minLength": 1}]
    names = schema["properties"]["env"]["propertyNames"]
    names["anyOf"] = [
        {"not": {"pattern": RESERVED_ENV_PATTERN}},
        {"enum": list(LOADER_ENV_ALLOWED)},
    ]
    fraction = {"required": ["gpu_milli"], "properties": {"gpu_milli": {"type": "integer"}}}
    schema["allOf"] = [
        {
            "if": fraction,
            "then": {"properties": {"gpus": {"minimum": 1}, "pool": {"enum": ["vgpu", "any"]}}},
        },
        {
            "if": {
                "required": ["gpu_memory_mib"],
                "properties": {"gpu_memory_mib": {"type": "integer"}},
            },
            "then": fraction,
        },
    ]


class JobRequest(JobSpec):
    """A job as submitted: a JobSpec whose `user` may be left out (the token's user),
    and whose `priority_class` and `priority` may be too (the default class, and its
    priority)."""

    model_config = ConfigDict(json_schema_extra=_what_jobspec_checks)

    #: The job's user: the token's by default; another only for an operator.
    user: UserName | None = Field(default=None)  # type: ignore[assignment]
    #: At most the class's priority (an operator may set any); absent: the class's.
    priority: int | None = Field(  # type: ignore[assignment]
        default=None, ge=PRIORITY_MIN, le=PRIORITY_MAX
    )

    def spec_for(self, user: str, priority: int = 0, priority_class: str | None = None) -> JobSpec:
        """The JobSpec of this request with its user, class and priority decided."""
        return JobSpec.model_validate(
            {
                **self.model_dump(),
                "user": user,
                "priority": priority,
                "priority_class": priority_class,
            }
        )
