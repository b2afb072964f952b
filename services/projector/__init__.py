"""The read-model writer: the SQL rows the gateway answers reads from."""
