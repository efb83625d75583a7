"""A Job's pod that the API server refused, as the Job controller's FailedCreate Events tell it. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dtjob.printable import printable

Json = Mapping[str, Any]


@dataclass(frozen=True)
class CreateRefusal:
    """A Job (the launcher's, the staging one) whose pod the API server refused: the Job controller's
    FailedCreate message, and when the Job was created (runPolicy.startupDeadlineSeconds counts from then)."""

    job: str
    message: str
    job_created: datetime | None


# A FailedCreate message quotes the admission's answer, which can be long.
FAILED_CREATE_MESSAGE_CHARS = 1000


def failed_create_view(event: Json) -> dict[str, Any]:
    """What newest_failed_create reads of an Event, its message cut as it is read: any pod of the namespace
    may post Events, and a LIST of them is kept until it is read."""
    kept = {k: event[k] for k in ("lastTimestamp", "eventTime") if k in event}
    return {**kept, "message": str(event.get("message") or "")[:FAILED_CREATE_MESSAGE_CHARS]}


def newest_failed_create(events: Iterable[Json]) -> str | None:
    """The message of the newest of a Job's FailedCreate Events (the Job controller records one per try,
    merged into a count), cut to FAILED_CREATE_MESSAGE_CHARS and then made printable, however the Events were
    read (a LIST's views, the watch's projections); None without one."""
    newest = max(events, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""), default=None)
    return printable(str((newest or {}).get("message") or "")[:FAILED_CREATE_MESSAGE_CHARS]) or None
