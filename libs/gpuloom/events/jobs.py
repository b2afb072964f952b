"""Value objects shared by several job events: what a user asks for."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class JobSpec(BaseModel):
    """What a user submitted. Validated at the gateway; carried verbatim in JobSubmitted."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    user: str = Field(min_length=1, max_length=100)
    account: str = Field(min_length=1, max_length=100)
    command: list[str] = Field(min_length=1)
    gpus: int = Field(ge=0, le=1024)
    gpu_model: list[str] = Field(default_factory=list)
    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000)
    time_limit_s: int | None = Field(default=None, gt=0)
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("command")
    @classmethod
    def _command_words_not_empty(cls, value: list[str]) -> list[str]:
        if not value[0]:
            raise ValueError("command[0] (the program) must not be empty")
        return value

    @field_validator("env")
    @classmethod
    def _env_names_valid(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not name or "=" in name or "\0" in name:
                raise ValueError(f"invalid environment variable name {name!r}")
        return value
