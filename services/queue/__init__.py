"""The queue service: gives admitted jobs their priority, cancels pending jobs (JobQueued, JobCancelled)."""
