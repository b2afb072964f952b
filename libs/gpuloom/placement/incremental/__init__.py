"""The fast twin's caches: what a placement cycle keeps from one cycle to the next so
that it re-reads only what the log changed since.

`IndexCache` (the node index and its scores, with the kept queue, holdings and released
views it owns) is what the placement service and the audit hold between cycles;
`placement_cycle(state, policy)` without one is the reference pass, and tests hold the
two to the same decisions. Each cache learns what changed from a `ChangeFeed`
(`gpuloom.state.changes`) that whoever folds the state feeds (the log follower, as one of
its observers): the state itself keeps no stamps for them.
"""
