"""Prometheus metrics shared by the services."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

EVENTS_FOLDED = Counter("gpuloom_events_folded_total", "Events folded into the state", ["service"])
EVENTS_VOIDED = Gauge("gpuloom_events_voided", "Events voided by the fold so far", ["service"])
EVENTS_PUBLISHED = Counter(
    "gpuloom_events_published_total", "Events this service published", ["service", "type"]
)
MALFORMED = Counter("gpuloom_events_malformed_total", "Malformed messages skipped", ["service"])
STATE_SEQ = Gauge("gpuloom_state_seq", "Stream sequence the service has folded to", ["service"])
DEAD_LETTERS = Counter(
    "gpuloom_dead_letters_total",
    "Messages the service could not handle, sent to the dead-letter stream",
    ["service", "reason_kind"],
)
DECIDE_SECONDS = Histogram(
    "gpuloom_decide_seconds",
    "Time spent in one decision cycle",
    ["service"],
    buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5),
)

WEBHOOK_ATTEMPTS = Counter(
    "gpuloom_webhook_attempts_total",
    "Webhook delivery attempts by result: delivered, retry (to be tried again), failed "
    "(given up, or the receiver answered 410 Gone)",
    ["result"],
)

SYNCS_REFUSED = Counter(
    "gpuloom_dispatch_syncs_refused_total",
    "Agents' sync requests the dispatcher could not read (a bad node name or sequence)",
)

PROJECTION_LAG = Gauge(
    "gpuloom_projection_lag",
    "Events in the log that a SQL projection has not written yet",
    ["projection"],
)
PROJECTION_QUARANTINED = Gauge(
    "gpuloom_projection_quarantined",
    "Rows a SQL projection's database refused, kept in projection_quarantine",
    ["projection"],
)


def serve_metrics(port: int, host: str = "127.0.0.1") -> None:
    """Expose /metrics on `host`:`port` (no-op for port 0)."""
    if port:
        start_http_server(port, addr=host)


SNAPSHOT_SEQ = Gauge(
    "gpuloom_snapshot_seq", "Stream sequence of the newest snapshot the service wrote", ["service"]
)
SNAPSHOT_RESTORED_SEQ = Gauge(
    "gpuloom_snapshot_restored_seq",
    "Stream sequence of the snapshot the service started from (0: it replayed from seq 1)",
    ["service"],
)
SNAPSHOT_BYTES = Gauge("gpuloom_snapshot_bytes", "Size of the newest snapshot written", ["service"])
SNAPSHOT_ENCODE_SECONDS = Histogram(
    "gpuloom_snapshot_encode_seconds",
    "Time to serialize the state for a snapshot: the event loop's pause (compressing it and the upload run beside the loop)",
    ["service"],
)
EXTENDER_VERB_SECONDS = Histogram(
    "gpuloom_extender_verb_seconds",
    "Time the scheduler extender took to answer kube-scheduler, by verb",
    ["verb"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
KUBE_ACTIONS = Counter(
    "gpuloom_kube_actions_total",
    "Calls the Kubernetes watcher made on pods (annotate, evict, delete), by outcome",
    ["action", "outcome"],
)
