"""When a job's runPolicy.activeDeadlineSeconds comes: from the spec as it is now (an edit moves it) and the
time the job became active (status.startTime). Pure."""

from __future__ import annotations

from datetime import datetime

from dtjob.spec.parse import JobSpec
from dtjob.timefmt import parse_time, seconds_after


def active_deadline(spec: JobSpec, start_time: str | None) -> datetime | None:
    """The instant the job fails with DeadlineExceeded; None without a deadline or before the job started."""
    seconds = spec.run_policy.active_deadline_seconds
    if seconds is None or not start_time:
        return None
    return seconds_after(parse_time(start_time), seconds)
