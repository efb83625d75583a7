"""The one RFC 3339 format of status times, SAS Secret annotations and events; kubectl's durations."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from dtjob.timefmt import format_micro_time, format_time, parse_duration, parse_time, seconds_after

MOMENT = datetime(2026, 3, 4, 5, 6, 7, 891011, tzinfo=UTC)


def test_times_are_written_in_utc_with_z() -> None:
    assert format_time(MOMENT) == "2026-03-04T05:06:07Z"
    assert format_micro_time(MOMENT) == "2026-03-04T05:06:07.891011Z"
    plus_two = MOMENT.astimezone(timezone(timedelta(hours=2)))
    assert format_time(plus_two) == "2026-03-04T05:06:07Z"


def test_what_is_written_reads_back() -> None:
    assert parse_time(format_time(MOMENT)) == MOMENT.replace(microsecond=0)
    assert parse_time("2026-03-04T07:06:07+02:00") == MOMENT.replace(microsecond=0)


def test_a_time_without_an_offset_or_no_time_at_all_is_refused() -> None:
    for text in ("2026-03-04T05:06:07", "junk", ""):
        with pytest.raises(ValueError):
            parse_time(text)


def test_seconds_after_saturates_instead_of_overflowing() -> None:
    assert seconds_after(MOMENT, 60) == MOMENT + timedelta(minutes=1)
    assert seconds_after(MOMENT, 2**62) == datetime.max.replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5s", 5), ("2m", 120), ("3h", 10800), ("1h30m", 5400), ("1.5h", 5400), ("90s", 90), ("500ms", 1)],
)
def test_a_duration_reads_as_kubectls_since_does(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "m", "0s", "-5s", "5d", "5s ", "1h 30m", "five s"])
def test_anything_else_is_not_a_duration(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)
