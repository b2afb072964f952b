"""The placement service: places queued jobs on GPUs with the configured policy (JobPlaced)."""
