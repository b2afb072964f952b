"""The dispatch service: each node's jobs, routed to that node's view alone."""
