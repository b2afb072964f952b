"""The gateway's side of webhooks: `/v1/webhooks` (`routes`): register (the secret
sealed for the log), list, show, renew, delete, and each webhook's deliveries as the
webhooks process recorded them.

Delivering is not the gateway's: the webhooks process (`services.webhooks`) follows
the log, writes the deliveries and sends them, under its own bus identity. What both
use is `gpuloom.webhooks` (policy, signing, sealing, the checked address);
docs/webhooks.md is the subscriber's side.
"""
