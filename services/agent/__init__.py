"""The node agent: heartbeats its nodes, runs the jobs placed on them, reports how they end.

One agent process serves one real node (GPUs discovered with NVML or nvidia-smi)
or many simulated nodes declared in an inventory file. Jobs run under a tiny
`/bin/sh` shim that outlives the agent, so a `kill -9` of the agent loses no job.
"""
