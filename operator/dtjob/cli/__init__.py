"""The `dtjob` command line: one module per command group, and what they share."""
