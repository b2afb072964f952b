"""Settings from environment variables (`GPULOOM_*`), with embedded-stack defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpuloom.events.health import CRITICAL_XIDS
from gpuloom.events.text import HOST_ADDRESS


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

    # --- Kubernetes (docs/kubernetes.md): the extender and the watcher ---------------------
    #: A kubeconfig naming the cluster whose GPUs gpuloom schedules; None: no Kubernetes
    #: (the two services then read the in-cluster service account, if any).
    kubeconfig: Path | None = None
    #: Where the scheduler extender listens: loopback, for a kube-scheduler on the same
    #: host; in a cluster, its Pod's address behind mutual TLS (deploy/k8s/).
    extender_host: str = "127.0.0.1"
    extender_port: int = Field(default=8090, ge=0, le=65535)
    #: Mutual TLS for the extender: its certificate and key, and the CA whose client
    #: certificates (kube-scheduler's) it accepts; all three, or none (loopback only).
    extender_tls_cert: Path | None = None
    extender_tls_key: Path | None = None
    extender_tls_client_ca: Path | None = None
    #: The account of a pod that names none (`gpuloom.io/account`).
    kube_default_account: str = Field(
        default="default", pattern=r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,62}$"
    )
    #: Pods the extender keeps in mind between filter and bind, at most (the oldest
    #: forgotten first: a bind then reads the pod from the API again).
    extender_pods_kept: int = Field(default=10_000, ge=100)
    #: Submissions of new pods the extender writes per second at most, over all
    #: namespaces (a burst of this many passes at once); more wait for a later filter.
    extender_submits_per_s: float = Field(default=500.0, gt=0)

    # --- The gateway's connections (services/gateway/connections.py; docs/security.md) ---
    #: Open connections at most; more are refused (503), or the oldest idle one closed.
    #: Lowered at start to what the file-descriptor limit leaves after the reserve.
    gateway_max_connections: int = Field(default=4096, ge=8)
    #: Open connections of one client address at most (429 beyond).
    gateway_max_connections_per_client: int = Field(default=64, ge=1)
    #: Connections with no request in progress (idle, or still sending headers) at
    #: most, as a share of gateway_max_connections: the most clients that have not
    #: sent a request yet (with or without a token) can hold.
    gateway_idle_share: float = Field(default=0.25, gt=0, le=1)
    #: Seconds a request's headers may take to arrive, from the connection or its
    #: first byte (408 and closed after), and its whole body after them.
    gateway_header_timeout_s: float = Field(default=10.0, gt=0, le=300)
    gateway_body_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    #: Seconds an idle keep-alive connection stays open.
    gateway_keepalive_s: float = Field(default=5.0, gt=0, le=300)
    #: File descriptors kept free of connections (NATS, the database, logs, files).
    gateway_fd_reserve: int = Field(default=256, ge=16)
    #: Host names (and addresses) a request's `Host` may name; anything else is 400, so
    #: a page on another site that rebinds its name to the gateway's address gets
    #: nothing. None: localhost, 127.0.0.1 and ::1 while the gateway listens on
    #: loopback, any otherwise (set it then: a proxy's name, the Service's). "*": any.
    gateway_allowed_hosts: list[str] | None = None

    # --- GET /v1/events budgets (services/gateway/stream_budget.py; 429 beyond) ---------
    #: Event streams one user, and everyone, may hold open.
    streams_per_user: int = Field(default=16, ge=1)
    streams_total: int = Field(default=256, ge=1)
    #: Streams replaying the log (starting over stream_replay_behind events back) at
    #: once, per user and in all, and replays one user may start a minute.
    stream_replays_per_user: int = Field(default=2, ge=1)
    stream_replays_total: int = Field(default=8, ge=1)
    stream_replays_per_minute: int = Field(default=10, ge=1)
    stream_replay_behind: int = Field(default=1000, ge=0)
    #: How long a gateway read waits for the read model to include the caller's own writes.
    read_your_writes_timeout_s: float = 2.0
    publish_timeout_s: float = 5.0
    #: /readyz: the most events the projection may lag behind the log and still be ready,
    ready_max_lag: int = Field(default=1000, ge=0)
    #: and how long (seconds) it may lag more than that before it is not ready.
    ready_grace_s: float = Field(default=5.0, ge=0)

    #: Snapshots of each service's folded state (`gpuloom.runtime.snapshots`): one is
    #: written once the state has folded this many events since the last one,
    snapshot_every_events: int = Field(default=10_000, ge=0)
    #: or this many seconds after the last one if any event came since (0 and 0:
    #: no snapshots; a restart then replays the whole log),
    snapshot_every_s: float = Field(default=300.0, ge=0)
    #: and the newest this many are kept (an older one serves if the newest is damaged).
    snapshot_keep: int = Field(default=2, ge=1, le=100)

    #: The longest time limit a job may ask for (Slurm's MaxTime), seconds; 0: no
    #: maximum but the contract's 32-bit one. The gateway answers 422 over it and
    #: admission rejects a job over it that reached the log some other way.
    max_time_limit_s: int = Field(default=30 * 24 * 3600, ge=0, le=2**31 - 1)
    #: The largest request body the gateway reads (413 above it), bytes.
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024)

    # --- Webhooks (the webhooks process; the gateway's routes; docs/webhooks.md) ------
    #: Deliver to loopback, private, link-local and other non-public addresses too
    #: (refused by default: a webhook must not reach into the cluster's own network).
    webhook_allow_private: bool = False
    #: Seconds to wait before each retry of a failed delivery (Standard Webhooks'
    #: schedule); after the last one the delivery is given up.
    webhook_retry_s: tuple[float, ...] = (5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 36000.0)
    #: How long one delivery attempt may take in all (resolve, connect, send, answer).
    webhook_timeout_s: float = Field(default=10.0, gt=0, le=300)
    #: The most webhooks one user may have (409 beyond).
    webhook_max_per_owner: int = Field(default=20, ge=1)
    #: Attempts in flight at once, in all and of one owner's webhooks (one per webhook:
    #: each delivers in log order), so that one user's slow receivers cannot hold
    #: every slot.
    webhook_max_in_flight: int = Field(default=256, ge=1)
    webhook_max_in_flight_per_owner: int = Field(default=8, ge=1)
    #: A webhook is disabled when more deliveries than this wait *and* its receiver has
    #: failed every attempt for `webhook_backlog_grace_s`; a backlog to a receiver that
    #: answers never disables it.
    webhook_max_backlog: int = Field(default=10_000, ge=1)
    webhook_backlog_grace_s: float = Field(default=3600.0, ge=0)
    #: The key that seals webhook secrets in the log (made on first start, mode 0600);
    #: None: <data_dir>/auth/webhook.key. The gateway seals with it, the webhooks
    #: process signs with what it opens: every replica of both needs the same one.
    webhook_key_file: Path | None = None

    # --- Who is asking (gateway): bearer tokens ---------------------------------------
    #: "jwt": every route but health and readiness (and /metrics where public) needs a
    #: bearer token; "off": anyone may do anything, which is logged at every start.
    auth: Literal["jwt", "off"] = "jwt"
    #: The stack's HS256 secret (made on first start, mode 0600); None: <data_dir>/auth/jwt.key.
    auth_secret_file: Path | None = None
    #: An identity provider's JWKS (OIDC): RS256/ES256 tokens are verified with its keys.
    auth_jwks_url: str | None = None
    #: Required `iss` and `aud` of accepted tokens (None: not checked).
    auth_issuer: str | None = None
    auth_audience: str | None = None
    #: The claim that names the user, and the one that lists roles.
    auth_user_claim: str = "sub"
    auth_roles_claim: str = "roles"
    #: Clock skew allowed on `exp`, `iat` and `nbf`, seconds.
    auth_leeway_s: float = Field(default=60.0, ge=0, le=600)
    #: The longest lifetime (exp - iat) a token may have, seconds (`gpuloom token issue` too).
    auth_max_ttl_s: int = Field(default=30 * 24 * 3600, ge=60)
    #: Whether the gateway's /metrics on its API port answers without a token. Off by
    #: default: a Prometheus scrapes GPULOOM_METRICS_PORT (no token, its own address:
    #: loopback unless GPULOOM_METRICS_HOST says otherwise), or sends a token.
    metrics_public: bool = False

    # --- This process's identity on the bus (NATS) --------------------------------------
    #: The nkey seed file of this process's NATS identity (None: connect without one).
    nats_seed_file: Path | None = None
    #: TLS to NATS: the CA that signed the server's certificate, and this client's own.
    nats_tls_ca_file: Path | None = None
    nats_tls_cert_file: Path | None = None
    nats_tls_key_file: Path | None = None

    # --- Who jobs run as (agent) --------------------------------------------------------
    #: One unprivileged account every job runs as (users are then not kept apart);
    #: None: a root agent runs each user's jobs as a uid of their own from
    #: `agent_job_uid_range`; an agent that is not root runs them as itself. A root
    #: agent refuses to start when it does not exist or is root's.
    agent_job_user: str | None = None
    #: Run each job as its submitting user's local account where that name exists
    #: (as Slurm does) and is not root's, else as the user's uid from the range.
    agent_map_users: bool = False
    #: The uids (and gids) a root agent gives gpuloom users, FIRST-LAST: each user
    #: its own, never root, never one a local account or group has.
    agent_job_uid_range: str = Field(default="200000-299999", pattern=r"^\d{1,10}-\d{1,10}$")
    #: Per-job cgroups (memory, CPU, pids limits; the whole job ended with it):
    #: `auto` where the agent is root and the host has them, `off` never.
    agent_cgroups: Literal["auto", "off"] = "auto"
    #: A /proc of its own per process job that hides other users' processes (`auto`:
    #: where the host's /proc does not hide them already and the agent can; an `unshare`
    #: and a `mount` per started job), `off`: never (argv of other users' jobs is then visible).
    agent_hide_processes: Literal["auto", "off"] = "auto"
    #: pids.max of each job's cgroup (processes and threads); 0: no limit.
    agent_max_pids: int = Field(default=4096, ge=0)
    #: Jobs of one user a node starts per second, and at once (`services.agent.pacing`):
    #: one user's burst of tasks that end at once cannot take the whole stack from
    #: everyone else. 0: no limit.
    agent_start_rate: float = Field(default=10.0, ge=0)
    agent_start_burst: int = Field(default=20, ge=1)
    #: How much lower the services no request waits on (accounting, webhooks, the
    #: projector, inventory) run than those that answer people (`runtime.priority`):
    #: a nice value, 0 to 19; 0: the same.
    background_nice: int = Field(default=10, ge=0, le=19)
    #: The most bytes a job's stdout, and its stderr, may hold: past it the job is
    #: stopped and fails naming the cap; 0: no cap.
    agent_max_log_bytes: int = Field(default=100 * 1024 * 1024, ge=0)
    #: The longest a preemption or a failed GPU's stop waits after the job's checkpoint
    #: signal (its `before_s`, at most this): one user's job cannot hold up another's
    #: start for long. 0: no wait (SIGTERM with the signal). Time limits are not bound.
    agent_checkpoint_most_s: float = Field(default=300.0, ge=0)
    #: How often the agent checks its GPUs' health (`services.agent.health`): NVML's
    #: Xid events, ECC errors, retired pages and a lost GPU, or a simulated node's
    #: injected faults; 0: never.
    agent_health_interval_s: float = Field(default=1.0, ge=0)
    #: The Xid errors that take a GPU out of service (`health.CRITICAL_XIDS`).
    agent_health_xids: list[int] = Field(default=list(CRITICAL_XIDS), max_length=256)
    #: Uncorrected volatile ECC errors a GPU may have before it is taken out of service.
    agent_health_ecc_errors: int = Field(default=0, ge=0)
    #: The simulated nodes' injected faults (YAML); None: `faults.yaml` in the run folder.
    agent_faults_file: Path | None = None
    #: Where other nodes reach this node's jobs (a gang's MASTER_ADDR when its replica
    #: 0 runs here); None: the first non-loopback IPv4 address of the host's name.
    agent_address: str | None = Field(default=None, pattern=HOST_ADDRESS)
    #: An agent of a real machine that finds no GPU serves it as a node without GPUs
    #: instead of refusing to start.
    agent_allow_no_gpu: bool = False
    #: The node's place in the cluster's topology, tightest level first:
    #: `nvlink=nvl-3,rack=r12,block=b2` (docs/topology.md); empty: none.
    agent_topology: str = ""
    #: Ports a gang's replica 0 may be given for its rendezvous (MASTER_PORT), FIRST-LAST.
    agent_rendezvous_ports: str = Field(default="29500-29999", pattern=r"^\d{1,5}-\d{1,5}$")
    #: Jobs that name an image (docs/containers.md): `auto` runs them with podman where
    #: it is installed, `podman` requires it (the agent refuses to start without it),
    #: `off` serves no image job.
    agent_containers: Literal["auto", "podman", "off"] = "auto"
    #: podman's `--pull` for a job's image: `missing` (pull what the node lacks),
    #: `never` (only images already on the node), `always` or `newer`.
    agent_image_pull: Literal["missing", "never", "always", "newer"] = "missing"

    heartbeat_interval_s: float = 1.0
    node_lost_timeout_s: float = 30.0
    #: More silent nodes at once than this share of the ready ones (and more than one)
    #: looks like inventory's own stall: each is lost only after one more timeout,
    #: and at most `node_loss_max_per_timeout` per timeout. 1 turns this off.
    node_loss_max_fraction: float = Field(default=0.5, gt=0, le=1)
    node_loss_max_per_timeout: int = Field(default=1, ge=1)
    #: An agent cut off from the bus this long stops its jobs itself (self-fencing),
    #: so that they are not still running when the lost node's jobs are requeued
    #: elsewhere. Must be under `node_lost_timeout_s` (with the cancel grace, twice,
    #: to spare); None: half of it; 0: never (a cut-off node's jobs may run twice).
    agent_fence_after_s: float | None = Field(default=None, ge=0)

    placement_policy: str = "bestfit"
    #: Multifactor priority: the most points age, fair share and size may add (0: off).
    priority_weight_age: int = Field(default=0, ge=0)
    priority_weight_fair_share: int = Field(default=0, ge=0)
    priority_weight_size: int = Field(default=0, ge=0)
    priority_max_age_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    fair_share_half_life_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    #: "easy": EASY backfill around the blocked head's reservation; "off": strict order.
    backfill: Literal["easy", "off"] = "easy"
    #: How many queued jobs behind the first that cannot start each placement pass
    #: tries (Slurm's `bf_max_job_test`, whose default this is); 0: all of them.
    backfill_depth: int = Field(default=500, ge=0, le=1_000_000)
    #: Blocked jobs may preempt lower preemptible classes and reclaim nominal quota.
    preemption: bool = True
    #: Users take turns among jobs of equal priority (start-time fair queuing): one
    #: user's burst does not put everyone else's jobs behind all of it. False: FIFO.
    queue_fair_queuing: bool = True
    #: The most of one user's jobs placed and not yet started, per schedulable node
    #: (`QueuePolicySet.unstarted_per_node`): beyond what the agents start soon
    #: (`agent_start_rate`), placed jobs would hold GPUs idle that other users could
    #: run on. 0: no limit.
    queue_unstarted_per_node: int = Field(default=4, ge=0, le=1_000_000)
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

    @model_validator(mode="after")
    def _fence_before_loss(self) -> Settings:
        fence = self.agent_fence_after_s
        if fence is not None and fence >= self.node_lost_timeout_s:
            raise ValueError(
                f"agent_fence_after_s ({fence}) must be less than node_lost_timeout_s "
                f"({self.node_lost_timeout_s}): an agent must stop its jobs before they "
                "are requeued elsewhere"
            )
        return self

    def fence_after_s(self) -> float:
        """Seconds without the bus after which an agent fences itself; 0: never."""
        if self.agent_fence_after_s is None:
            return self.node_lost_timeout_s / 2
        return self.agent_fence_after_s

    def secret_file(self) -> Path:
        return self.auth_secret_file or self.data_dir / "auth" / "jwt.key"

    def webhook_key(self) -> Path:
        return self.webhook_key_file or self.data_dir / "auth" / "webhook.key"

    def run_dir(self) -> Path:
        return self.agent_run_dir or self.data_dir / "agent"


def load_settings() -> Settings:
    return Settings()
