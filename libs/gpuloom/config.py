"""Settings from environment variables (`GPULOOM_*`), with embedded-stack defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPULOOM_", extra="ignore")

    nats_url: str = "nats://127.0.0.1:4222"
    database_url: str = "sqlite+aiosqlite:///.gpuloom/gpuloom.db"
    stream: str = "GPULOOM"
    #: JetStream de-duplication window for `Nats-Msg-Id`, seconds.
    dedup_window_s: float = 2 * 3600
    #: 3 in a NATS cluster (deploy/), 1 on one server.
    stream_replicas: int = 1
    data_dir: Path = Path(".gpuloom")

    gateway_host: str = "127.0.0.1"
    gateway_port: int = 8080
    #: How long a gateway read waits for its projection to include the gateway's own writes.
    read_your_writes_timeout_s: float = 2.0
    publish_timeout_s: float = 5.0

    heartbeat_interval_s: float = 1.0
    node_lost_timeout_s: float = 10.0

    placement_policy: str = "bestfit"
    #: Multifactor priority: the most points age, fair share and size may add (0: off).
    priority_weight_age: int = Field(default=0, ge=0)
    priority_weight_fair_share: int = Field(default=0, ge=0)
    priority_weight_size: int = Field(default=0, ge=0)
    priority_max_age_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    fair_share_half_life_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    #: "easy": EASY backfill around the blocked head's reservation; "off": strict order.
    backfill: Literal["easy", "off"] = "easy"
    #: Blocked jobs may preempt lower preemptible classes and reclaim nominal quota.
    preemption: bool = True
    cancel_grace_s: float = 5.0
    #: Running jobs are charged at least this often (seconds); 0: only when they end.
    charge_interval_s: float = Field(default=300.0, ge=0)
    #: Where agents keep each job's run folder (logs, pid, exit status).
    agent_run_dir: Path | None = None

    #: Prometheus /metrics port of a non-HTTP service; 0 disables it.
    metrics_port: int = Field(default=0, ge=0)
    #: Address /metrics binds to: loopback by default, 0.0.0.0 in containers.
    metrics_host: str = "127.0.0.1"
    log_level: str = "INFO"

    def run_dir(self) -> Path:
        return self.agent_run_dir or self.data_dir / "agent"


def load_settings() -> Settings:
    return Settings()
