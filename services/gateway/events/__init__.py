"""The event stream (`routes`: GET /v1/events), the log as CloudEvents over SSE. What the
streams of a gateway share lives beside it, in `services.gateway.stream`, `fanout` and
`stream_budget` (the app's state holds them)."""
