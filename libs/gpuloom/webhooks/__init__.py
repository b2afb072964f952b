"""What the gateway's `/v1/webhooks` routes and the webhooks process share: the parts of
webhooks that are not a process's own.

- `policy`: pure (what a webhook gets, retries, which addresses may be reached, when a
  backlog disables one);
- `signing`: Standard Webhooks signatures and secrets;
- `sealing`: the secrets sealed for the log under the stack's webhook key (the gateway
  seals at registration, the webhooks process opens to sign);
- `transport`: one attempt over HTTP to a checked, pinned address (the gateway checks a
  URL's address at registration with it).

Who sees which event is `gpuloom.auth.visibility`, the event stream's rule. The
processes are `services.gateway.webhooks` (the routes) and `services.webhooks` (the
outbox and the sender); docs/webhooks.md is the subscriber's side.
"""
