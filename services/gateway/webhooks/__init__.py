"""Webhooks: the log's events POSTed to subscribers' URLs, signed (Standard Webhooks).

- `signing`, `sealing`, `policy`: pure (signatures, the sealed secrets, retries, which
  addresses may be reached, which events a webhook gets);
- `outbox`: the durable consumer `webhooks` writes each event every webhook gets into
  the deliveries table, then acks it, so a restart neither loses nor repeats events;
- `sender`: one worker per webhook delivers its rows in log order, with retries;
- `transport`, `lanes`: one attempt (a total deadline, a bounded read, the address
  checked and pinned); each webhook's own client and the slots in flight;
- `routes`: `/v1/webhooks`.

docs/webhooks.md is the subscriber's side.
"""
