"""runPolicy.progressDeadlineSeconds: a running world whose rank 0 prints no record one step further for that
long is restarted as hung (counted against backoffLimit), timed on the operator's clock from the world's start
of Running and from each record it saw advance; never on a pass that could not read the log."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from dtjob.contract.results_upload import RETRYING, UploadReport
from dtjob.machine import decide
from dtjob.spec.reader import SpecError
from dtjob.state.decision import Decision, DeletePod
from dtjob.state.observed import LauncherState, Observed, PodState
from dtjob.state.status import Condition, JobStatus, status_from_dict
from dtjob.timefmt import format_time

from tests.unit.operator_fixtures import job_spec

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
STARTED = NOW - timedelta(minutes=20)  # the world's start of Running
DEADLINE = {"runPolicy": {"progressDeadlineSeconds": 300, "backoffLimit": 2}}


def worker(index: int, attempt: int) -> PodState:
    return PodState(
        name=f"rn50-worker-{index}", role="worker", attempt=attempt, index=index, phase="Running",
        scheduled=True, ready=True, deleting=False, uid=f"uid-{index}", created=STARTED - timedelta(hours=1),
    )  # fmt: skip


def launcher(attempt: int) -> LauncherState:
    return LauncherState(
        attempt, deleting=False, running=True, succeeded=False, failed=False, pod_name="rn50-launcher-abcde",
        world_size=2,
    )  # fmt: skip


def record(step: int, epoch: int = 1, updated_at: str = "2026-03-01T11:50:00Z") -> dict[str, Any]:
    return {"epoch": epoch, "epochs": 90, "step": step, "stepsPerEpoch": 5004, "updatedAt": updated_at}


def running(
    progress: dict[str, Any] | None = None, seen: datetime | None = None, restarts: int = 0
) -> JobStatus:
    running_since = Condition("Running", "True", "LauncherRunning", "4 ranks", format_time(STARTED))
    return JobStatus(
        phase="Running", conditions=(running_since,), restarts=restarts, start_time=format_time(STARTED),
        workers_total=2, workers_ready=2, launcher_state="Running", launcher_pod="rn50-launcher-abcde",
        training_progress=progress, last_progress_time=format_time(seen) if seen else None,
    )  # fmt: skip


def observed(progress: dict[str, Any] | None, read: bool = True, attempt: int = 0) -> Observed:
    return Observed(
        pods=(worker(0, attempt), worker(1, attempt)), launcher=launcher(attempt), training_progress=progress,
        progress_read=read,
    )  # fmt: skip


def restarted_as_hung(d: Decision) -> bool:
    cond = d.status.condition("Restarting")
    return cond is not None and cond.reason == "ProgressDeadlineExceeded" and d.status.phase == "Restarting"


def test_a_record_one_step_further_stamps_the_operators_clock_not_the_records() -> None:
    prev = running(record(40), seen=NOW - timedelta(minutes=4))
    d = decide(job_spec(**DEADLINE), observed(record(41, updated_at="1970-01-01T00:00:00Z")), prev, NOW)
    assert d.status.last_progress_time == format_time(NOW)
    assert d.status.phase == "Running" and d.status.restarts == 0
    assert status_from_dict(d.status.to_dict()).last_progress_time == format_time(NOW)


def test_no_step_further_past_the_deadline_restarts_the_world_counted_naming_its_last_record() -> None:
    seen = NOW - timedelta(seconds=301)
    # The record's own time claims it was written just now: the operator's clock decides.
    stale = record(40, updated_at=format_time(NOW))
    d = decide(job_spec(**DEADLINE), observed(stale), running(record(40), seen=seen), NOW)
    assert restarted_as_hung(d) and d.status.restarts == 1 and d.status.infrastructure_restarts == 0
    cond = d.status.condition("Restarting")
    assert cond is not None
    assert "launcher pod rn50-launcher-abcde showed no training progress for 301s" in cond.message
    assert "(runPolicy.progressDeadlineSeconds 300)" in cond.message
    assert f"its last record (epoch 1 step 40) was seen at {format_time(seen)}" in cond.message
    assert "restart 1 of 2" in cond.message
    assert [e.reason for e in d.events if e.type == "Warning"][:1] == ["ProgressDeadlineExceeded"]
    # The hung world goes: its workers are deleted for the next one.
    assert (
        DeletePod("rn50-worker-0", "uid-0") in d.actions and DeletePod("rn50-worker-1", "uid-1") in d.actions
    )


def test_a_world_that_printed_no_record_is_timed_from_its_start_of_running() -> None:
    d = decide(job_spec(**DEADLINE), observed(None), running(), STARTED + timedelta(seconds=299))
    assert d.status.phase == "Running" and d.requeue_after is not None and d.requeue_after <= 2
    d = decide(job_spec(**DEADLINE), observed(None), running(), NOW)
    assert restarted_as_hung(d)
    cond = d.status.condition("Restarting")
    assert cond is not None and "for 1200s" in cond.message
    assert f"no progress record since the world started running at {format_time(STARTED)}" in cond.message


def test_a_restarted_world_gets_the_whole_deadline_from_its_own_start() -> None:
    # The last record was the previous world's, long ago; this world started running 100 s ago.
    prev = running(record(40), seen=NOW - timedelta(hours=2), restarts=1)
    prev = JobStatus(
        **{**prev.__dict__, "conditions": (Condition("Running", "True", "LauncherRunning", "", format_time(
            NOW - timedelta(seconds=100))),)}
    )  # fmt: skip
    d = decide(job_spec(**DEADLINE), observed(record(40), attempt=1), prev, NOW)
    assert d.status.phase == "Running" and d.status.restarts == 1


def test_a_pass_that_could_not_read_the_log_shows_no_hang() -> None:
    prev = running(record(40), seen=NOW - timedelta(hours=1))
    d = decide(job_spec(**DEADLINE), observed(None, read=False), prev, NOW)
    assert d.status.phase == "Running" and d.status.restarts == 0
    assert d.status.last_progress_time == prev.last_progress_time


def test_within_the_deadline_the_world_trains_on_and_is_looked_at_again_when_it_would_expire() -> None:
    prev = running(record(40), seen=NOW - timedelta(seconds=200))
    d = decide(job_spec(**DEADLINE), observed(record(40)), prev, NOW)
    assert d.status.phase == "Running" and d.requeue_after is not None and d.requeue_after <= 101


def test_without_a_deadline_a_silent_world_runs_on() -> None:
    prev = running(record(40), seen=NOW - timedelta(days=2))
    d = decide(job_spec(), observed(record(40)), prev, NOW)
    assert d.status.phase == "Running" and d.status.restarts == 0


def test_past_backoff_limit_a_hung_world_fails_the_job() -> None:
    prev = running(record(40), seen=NOW - timedelta(seconds=400), restarts=2)
    d = decide(job_spec(**DEADLINE), observed(record(40), attempt=2), prev, NOW)
    failed = d.status.condition("Failed")
    assert d.status.phase == "Failed" and failed is not None and failed.reason == "ProgressDeadlineExceeded"
    assert "runPolicy.backoffLimit (2) reached after 2 restarts" in failed.message


def test_an_unreadable_last_progress_time_is_read_as_none() -> None:
    assert status_from_dict({"lastProgressTime": "yesterday"}).last_progress_time is None
    assert status_from_dict({"lastProgressTime": 7}).last_progress_time is None


@pytest.mark.parametrize("seconds", [0, 29, -5])
def test_a_deadline_shorter_than_30_seconds_is_refused_naming_the_field(seconds: int) -> None:
    with pytest.raises(SpecError, match=r"spec\.runPolicy\.progressDeadlineSeconds"):
        job_spec(runPolicy={"progressDeadlineSeconds": seconds})


def test_a_world_that_trained_to_the_end_is_never_restarted_into_training_again() -> None:
    """After the last step: rank 0 validates, saves and uploads the results, printing no record; a storage
    outage may hold its upload for spec.output.uploadRetrySeconds. None of that is a hang."""
    done = {**record(5004, epoch=90), "percent": 100.0}
    d = decide(job_spec(**DEADLINE), observed(done), running(done, seen=NOW - timedelta(hours=1)), NOW)
    assert d.status.phase == "Running" and d.status.restarts == 0
    uploading = Observed(
        pods=(worker(0, 0), worker(1, 0)), launcher=launcher(0), training_progress=record(4000),
        progress_read=True, results_upload=UploadReport(RETRYING, "storage refused (503): again in 20s"),
    )  # fmt: skip
    d = decide(job_spec(**DEADLINE), uploading, running(record(4000), seen=NOW - timedelta(hours=1)), NOW)
    assert d.status.phase == "Running" and d.status.restarts == 0 and d.status.results_state == RETRYING


def test_a_tail_without_a_record_after_the_world_printed_some_shows_no_hang() -> None:
    """Other ranks' lines can push rank 0's last record out of the tail read: that is no sign of a hang."""
    prev = running(record(40), seen=NOW - timedelta(minutes=10))  # this world's, 600 s ago
    d = decide(job_spec(**DEADLINE), observed(None), prev, NOW)
    assert d.status.phase == "Running" and d.status.restarts == 0
