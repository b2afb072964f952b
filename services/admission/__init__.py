"""The admission service: admits or rejects submitted jobs (writes JobAdmitted, JobRejected)."""
