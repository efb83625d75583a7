"""A status edited by hand (`kubectl edit --subresource=status`) is read leniently: a time that does not parse
or a field of the wrong type is read as absent, so the next reconcile rewrites it instead of raising on every
retry with nothing recorded."""

from __future__ import annotations

from typing import Any

import pytest
from dtjob.machine import decide
from dtjob.state.decision import CreateWorker
from dtjob.state.observed import Observed
from dtjob.state.status import status_from_dict
from dtjob.timefmt import format_time, parse_time

from tests.unit.operator_fixtures import job_spec
from tests.unit.test_operator_status import NOW, launcher, worker

# Times the CRD's `format: date-time` lets through (no offset, reduced precision) or that are just wrong.
UNREADABLE_TIMES = ["2026-01-02T03:04:05", "2026-01-02T03:04", "yesterday", ""]


@pytest.mark.parametrize("stamp", UNREADABLE_TIMES)
def test_an_unreadable_start_time_restarts_the_deadline_clock(stamp: str) -> None:
    prev = status_from_dict({"phase": "Running", "startTime": stamp})
    obs = Observed(pods=(worker(0), worker(1)), launcher=launcher(), generation=1)
    d = decide(job_spec(runPolicy={"activeDeadlineSeconds": 3600}), obs, prev, NOW)
    assert d.status.start_time == format_time(NOW)
    assert d.status.phase == "Running"


@pytest.mark.parametrize("stamp", UNREADABLE_TIMES)
def test_an_unreadable_completion_time_does_not_break_the_ttl(stamp: str) -> None:
    prev = status_from_dict({"phase": "Succeeded", "startTime": format_time(NOW), "completionTime": stamp})
    d = decide(job_spec(runPolicy={"ttlSecondsAfterFinished": 60}), Observed(generation=1), prev, NOW)
    assert d.status.phase == "Succeeded"
    assert d.status.completion_time is None or parse_time(d.status.completion_time)


WRONG_TYPES: list[dict[str, Any]] = [
    {"restarts": "three", "gpus": [8], "workers": {"total": "x", "ready": None}},
    {"workers": "2/2", "launcher": ["Running"], "output": "https://example"},
    {"conditions": "Ready", "phase": 7, "observedGeneration": "1"},
    {"conditions": [None, "x", {"type": "Created"}], "staging": "done", "progress": [1]},
    {"output": {"logsMissing": "pod-0", "logsTruncated": 5, "logsError": {"a": 1}, "url": 3}},
    {"restarts": 10**400, "startTime": 12, "completionTime": ["2026-01-02T03:04:05Z"]},
]


@pytest.mark.parametrize("data", WRONG_TYPES)
def test_status_fields_of_the_wrong_type_read_as_absent_and_write_back(data: dict[str, Any]) -> None:
    prev = status_from_dict(data)
    prev.to_dict()  # what reconcile writes back
    d = decide(job_spec(), Observed(generation=1), prev, NOW)
    assert d.status.phase is not None
    d.status.to_dict()


def test_a_negative_restart_count_is_read_as_zero_so_pods_get_a_valid_attempt_label() -> None:
    prev = status_from_dict({"phase": "Pending", "restarts": -1, "startTime": format_time(NOW)})
    d = decide(job_spec(), Observed(generation=1), prev, NOW)
    assert [a for a in d.actions if isinstance(a, CreateWorker)] == [CreateWorker(0, 0), CreateWorker(1, 0)]
    assert d.status.restarts == 0
