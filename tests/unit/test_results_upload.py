"""The results upload after training: the lines it prints, how the operator reads them into status, and an
upload that failed for good (an infrastructure failure that keeps the results, never a restart)."""

from __future__ import annotations

import shlex
from datetime import UTC, datetime, timedelta

from dtjob import results_upload
from dtjob.actions import DeletePod
from dtjob.desired.command import launcher_script
from dtjob.machine import decide
from dtjob.observed import LauncherState, Observed, PodState
from dtjob.results_upload import UPLOAD_FAILED_EXIT, latest_report
from dtjob.status import JobStatus
from dtjob.timefmt import format_time

from tests.unit.operator_fixtures import job_spec

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
OUTPUT = {"account": "acct1", "container": "results", "credentials": {"authMode": "workloadIdentity"}}


def test_the_newest_line_says_the_state_and_a_retry_says_why() -> None:
    log = "\n".join([
        "[1,0]<stdout>:DTJOB_PROGRESS {}",
        results_upload.started_line(),
        results_upload.retry_line(1, 2, 598, "storage refused: 503 Service Unavailable\nsecond line"),
    ])  # fmt: skip
    report = latest_report(log)
    assert report is not None and report.state == "Retrying"
    assert report.message == (
        "retrying in 2 s (try 1 failed, 598 s of retries left): storage refused: 503 Service Unavailable "
        "second line"
    )
    done = latest_report(log + "\n" + results_upload.done_line(3, 1024, 2))
    assert done is not None and done.state == "Uploaded"
    assert latest_report("training only\n") is None
    started = latest_report(results_upload.started_line())
    assert started is not None and started.state == "Uploading"


def test_backoff_doubles_up_to_a_minute() -> None:
    assert [results_upload.backoff_seconds(n) for n in (1, 2, 3, 6, 7, 20)] == [2, 4, 8, 60, 60, 60]


def test_the_launcher_keeps_trainings_exit_code_and_marks_an_upload_that_failed_for_good() -> None:
    spec = job_spec(output={**OUTPUT, "uploadRetrySeconds": 900})
    script = launcher_script(spec, "uid-1")
    training, upload = script.strip().splitlines()[-2:]
    assert training.endswith(" || exit $?")
    assert upload.endswith(f" || exit {UPLOAD_FAILED_EXIT}")
    remote = shlex.split(shlex.split(upload.removesuffix(f" || exit {UPLOAD_FAILED_EXIT}"))[2])
    assert remote[remote.index("--retry-for") + 1] == "900"
    assert UPLOAD_FAILED_EXIT > 159, "outside user exit codes and 128+signal"


def failed_launcher(exit_code: int) -> LauncherState:
    pod = PodState(
        "rn50-launcher-x", "launcher", 0, None, "Failed", scheduled=True, ready=False, deleting=False,
        reason=f"Error, exit code {exit_code}", exit_code=exit_code, termination_reason="Error",
    )  # fmt: skip
    return LauncherState(
        0, deleting=False, running=False, succeeded=False, failed=True, pod_name=pod.name, reason=pod.reason,
        failed_pod=pod,
    )  # fmt: skip


def world(launcher: LauncherState, log: str | None) -> Observed:
    workers = tuple(
        PodState(f"rn50-worker-{i}", "worker", 0, i, "Running", scheduled=True, ready=True, deleting=False)
        for i in range(2)
    )
    report = latest_report(log) if log is not None else None
    return Observed(pods=workers, launcher=launcher, results_upload=report, uid="uid-1")


def running() -> JobStatus:
    return JobStatus(phase="Running", start_time=format_time(NOW - timedelta(hours=10)), launcher_pod="x")


FAILED_LOG = results_upload.failed_line(9, 600, "storage refused: 503 Service Unavailable")


def test_an_upload_that_failed_for_good_fails_the_job_as_storage_and_keeps_rank_0s_pod() -> None:
    spec = job_spec(output=OUTPUT, runPolicy={"backoffLimit": 3, "cleanPodPolicy": "Running"})
    d = decide(spec, world(failed_launcher(UPLOAD_FAILED_EXIT), FAILED_LOG), running(), NOW)
    failed = d.status.condition("Failed")
    assert d.status.phase == "Failed" and failed is not None, d.status
    assert failed.reason == "ResultsUploadFailed"
    assert failed.message.startswith("training finished, but the results upload failed: failed after 9 tries")
    assert "the results are kept on pod rn50-worker-0" in failed.message
    assert d.status.restarts == 0, "never a restart: that would train again"
    assert (d.status.results_state, d.status.results_pod) == ("Failed", "rn50-worker-0")
    # Once the logs are up, cleanPodPolicy Running frees every running pod but the one holding the results.
    after = decide(
        spec, world(failed_launcher(UPLOAD_FAILED_EXIT), None), d.status, NOW + timedelta(minutes=6)
    )
    deleted = {a.name for a in after.actions if isinstance(a, DeletePod)}
    assert deleted == {"rn50-worker-1"}, after.actions


def test_the_reserved_exit_code_without_the_uploads_own_line_is_an_ordinary_launcher_failure() -> None:
    spec = job_spec(output=OUTPUT, runPolicy={"backoffLimit": 3})
    d = decide(spec, world(failed_launcher(UPLOAD_FAILED_EXIT), "a user program exiting 200"), running(), NOW)
    assert d.status.phase == "Restarting"
    assert d.status.results_state is None


def test_status_shows_a_retrying_upload_and_then_uploaded() -> None:
    spec = job_spec(output=OUTPUT)
    retry = results_upload.retry_line(2, 4, 590, "ServiceRequestError: connection refused")
    launcher = LauncherState(0, deleting=False, running=True, succeeded=False, failed=False, pod_name="l")
    d = decide(spec, world(launcher, retry), running(), NOW)
    assert d.status.results_state == "Retrying"
    assert d.status.results_message is not None and "connection refused" in d.status.results_message
    assert d.status.to_dict()["output"]["results"]["state"] == "Retrying"
    done = LauncherState(0, deleting=False, running=False, succeeded=True, failed=False, pod_name="l")
    d2 = decide(spec, world(done, results_upload.done_line(2, 10, 3)), d.status, NOW)
    assert d2.status.phase == "Succeeded" and d2.status.results_state == "Uploaded"
