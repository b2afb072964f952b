"""The fold's rules, one module per aggregate: `jobs` (to the queue), `runs` (placed
to charged), `nodes`, `accounts`, `cluster` (queue policy, audit) and `policies`
(priority classes, limits) and `reservations` (advance reservations). Each exports `RULES`, its entries of the typed rule
table (`common.rule`) that `gpuloom.state.fold.apply` dispatches on."""
