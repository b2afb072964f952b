"""gpuloom's Kubernetes device plugin (kubelet device plugin API v1beta1).

Run on each Kubernetes GPU node as a DaemonSet: it advertises the node's GPUs as the
extended resource `gpuloom.io/gpu` and, when the kubelet starts a container, gives it
the GPUs gpuloom chose (the pod's `gpuloom.io/*` annotations), never the kubelet's
pick. `api_pb2*.py` are generated from `proto/api.proto` (`proto/generate.sh`).
"""
