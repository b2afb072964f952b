"""The webhooks process: the log's events POSTed to subscribers' URLs, signed (Standard
Webhooks), apart from the gateway and under a bus identity of its own.

- `fold`: its own fold of the log (which webhooks exist, who owns each job);
- `outbox`: the durable consumer `webhooks` writes each event every webhook gets into
  the deliveries table, then acks it, so a restart neither loses nor repeats events;
- `sender`: one worker per webhook delivers its rows in log order, with retries;
- `lanes`: each webhook's own client and the slots in flight;
- `disable`: WebhookDisabled, the one event it writes.

What it shares with the gateway's `/v1/webhooks` routes is `gpuloom.webhooks` (policy,
signing, sealing, one attempt over HTTP); docs/webhooks.md is the subscriber's side.
"""
