"""The scheduler extender: gpuloom as kube-scheduler's GPU scheduler (docs/kubernetes.md)."""
