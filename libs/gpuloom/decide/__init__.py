"""Pure decisions: functions of the folded state that return the events to write
(`gpuloom.events.Decision`), one module per writing service, and `explain`, the query
that says why a job waits."""
