"""The units every layer counts GPUs and CPUs in, defined once.

A GPU is 1000 milli-GPU: a whole-GPU request takes all of it, a fractional (vGPU)
request a share in (0, 1000). Quotas, charges (`gpu_milli_seconds`), placement's free
capacity and the metrics all count in it, so a share and a whole GPU add up exactly.
CPU requests use the same scale (`cpu_milli`, 1000 per core), as Kubernetes does.
"""

from __future__ import annotations

#: Milli-GPU in one whole GPU.
MILLI_PER_GPU = 1000
#: Milli-CPU in one core.
MILLI_PER_CPU = 1000
