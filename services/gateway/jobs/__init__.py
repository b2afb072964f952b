"""Jobs: submitting one (`submit`: POST /v1/jobs) or a batch (`batch`: POST
/v1/job-batches), and listing, showing, cancelling, explaining a job and reading its
events and logs (`routes`: /v1/jobs). What both submission routes check and write is
`submitting` (with `submit_policy`, its class and limits, and `requests`, the HTTP body);
cancelling is `cancelling`. A job array is read as one job by `reads.arrays`."""
