"""A Python client for DistributedTrainingJobs: `from dtjob.client import Client` (docs/python-client.md)."""

from dtjob.cli.results import Downloaded
from dtjob.client.client import Client, JobRef, Results
from dtjob.client.errors import AccessDenied, DtjobError, InvalidJob, JobNotFound, WaitTimeout
from dtjob.client.status import JobStatus, Progress, progress_line
from dtjob.state.status import Condition

__all__ = [
    "AccessDenied",
    "Client",
    "Condition",
    "Downloaded",
    "DtjobError",
    "InvalidJob",
    "JobNotFound",
    "JobRef",
    "JobStatus",
    "Progress",
    "Results",
    "WaitTimeout",
    "progress_line",
]
