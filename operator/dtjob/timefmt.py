"""RFC 3339 timestamps as the operator writes them: in status, in the SAS Secrets' annotations and in events.

One format everywhere: UTC with `Z`, whole seconds (the API's metav1.Time); an event's eventTime is the one
place with microseconds (metav1.MicroTime). Reading accepts any RFC 3339 offset, but never a time without
one. Also durations as kubectl reads them (`--since 5m`), and spans as a person reads them (an ETA). Pure.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from typing import Any


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


def parse_time_or_none(value: Any) -> datetime | None:
    """`value` as parse_time reads it, or None where it is absent, not a string or unreadable: a time read
    back from the API (status, a pod's or node's conditions) that anyone may have edited."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_time(value)
    except ValueError:
        return None


def seconds_after(moment: datetime, seconds: int) -> datetime:
    """moment + seconds, saturating at the last representable instant: a deadline or TTL beyond it never
    comes, and must not raise OverflowError in the middle of a reconcile."""
    try:
        return moment + timedelta(seconds=seconds)
    except OverflowError:
        return datetime.max.replace(tzinfo=UTC)


_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|\u00b5s|ms|s|m|h)")


def parse_duration(text: str) -> int:
    """A duration as Go writes one and kubectl reads it (`5s`, `2m`, `3h`, `1h30m`, `1.5h`), in whole seconds,
    rounded up as kubectl rounds --since; ValueError for anything else, or for no time at all."""
    parts = list(_DURATION_PART.finditer(text))
    if not parts or "".join(p.group(0) for p in parts) != text:
        raise ValueError(f"not a duration like 30s, 5m or 2h: {text!r}")
    seconds = sum(float(p.group(1)) * _DURATION_UNITS[p.group(2)] for p in parts)
    if seconds <= 0:
        raise ValueError(f"a duration longer than zero, not {text!r}")
    return math.ceil(round(seconds, 9))


def format_span(seconds: int) -> str:
    """A span a person plans with, its two largest units: `45s`, `12m30s`, `1h12m`, `3d4h`."""
    seconds = max(0, int(seconds))
    units = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
    for i, (unit, size) in enumerate(units[:-1]):
        if seconds >= size:
            small_unit, small_size = units[i + 1]
            rest = (seconds % size) // small_size
            return f"{seconds // size}{unit}" + (f"{rest}{small_unit}" if rest else "")
    return f"{seconds}s"
