"""The Kubernetes watcher: Nodes and pods into gpuloom's log (docs/kubernetes.md)."""
