"""Usage (`routes`: /v1/usage, /v1/usage/jobs): the accounting ledger's GPU time, as JSON
or CSV."""
