"""The cluster: its nodes (list, pools, cordons, removal), the queue, the latest audit,
the events' schemas and /healthz (`routes`), the operators' policies on who runs
what, priority classes and limits (`policies`), and advance reservations
(`reservations`, their bodies in `reservation_bodies`)."""
