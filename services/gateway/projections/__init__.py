"""What the readers of the log could not keep up with or take: each SQL projection's
checkpoint, lag and quarantined rows, and this gateway's readiness (`routes`:
/v1/projections, /readyz), and the services' dead letters (`deadletters`:
/v1/deadletters)."""
