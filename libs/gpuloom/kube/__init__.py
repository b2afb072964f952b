"""gpuloom as the GPU scheduler of a Kubernetes cluster (docs/kubernetes.md): the pure
part. What a pod asks for and the job it becomes (`pods`), what a Node offers and the
gpuloom node it is (`nodes`), the scheduler extender's answers (`extender`) and the
watcher's round (`watch`), each a function of the folded state and of what was read from
the Kubernetes API, with no I/O: the services `extender` and `kubewatch` translate."""
