"""RFC 3339 timestamps as the operator writes them: in status, in the SAS Secrets' annotations and in events.

One format everywhere: UTC with `Z`, whole seconds (the API's metav1.Time); an event's eventTime is the one
place with microseconds (metav1.MicroTime). Reading accepts any RFC 3339 offset, but never a time without
one. Pure.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


def format_time(moment: datetime) -> str:
    """`2026-01-02T03:04:05Z`: UTC, whole seconds."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(moment: datetime) -> str:
    """`2026-01-02T03:04:05.123456Z`: UTC with microseconds (an Event's eventTime)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime:
    """An RFC 3339 timestamp (`Z` or a numeric offset) as an aware datetime; ValueError for anything else,
    a timestamp without an offset included."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        raise ValueError(f"timestamp without a timezone: {text!r}")
    return moment


def seconds_after(moment: datetime, seconds: int) -> datetime:
    """moment + seconds, saturating at the last representable instant: a deadline or TTL beyond it never
    comes, and must not raise OverflowError in the middle of a reconcile."""
    try:
        return moment + timedelta(seconds=seconds)
    except OverflowError:
        return datetime.max.replace(tzinfo=UTC)
