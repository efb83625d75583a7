"""The results upload after training: the lines it prints, how the operator reads them into status, and an
upload that failed for good (an infrastructure failure that keeps the results, never a restart)."""

from __future__ import annotations

import shlex
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from dtjob.azure.errors import StorageFailure
from dtjob.cli.results import kept_results_pod
from dtjob.contract import results_upload
from dtjob.contract.results_upload import UPLOAD_FAILED_EXIT, latest_report
from dtjob.desired.command import launcher_script
from dtjob.machine import decide
from dtjob.spec.parse import JobSpec
from dtjob.state.decision import DeleteJob, DeletePod
from dtjob.state.observed import LauncherState, Observed, PodState
from dtjob.state.status import JobStatus
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


def failed_for_good(run_policy: dict[str, object]) -> tuple[JobSpec, JobStatus]:
    spec = job_spec(output=OUTPUT, runPolicy=run_policy)
    d = decide(spec, world(failed_launcher(UPLOAD_FAILED_EXIT), FAILED_LOG), running(), NOW)
    # The logs are up and the SAS Secrets gone, as they are by the time a person uploads by hand.
    return spec, replace(d.status, logs_uploaded=True, sas_secrets_deleted=True)


def test_kept_results_hold_the_ttl_until_they_are_uploaded() -> None:
    spec, status = failed_for_good({"ttlSecondsAfterFinished": 60, "cleanPodPolicy": "Running"})
    later = decide(spec, world(failed_launcher(UPLOAD_FAILED_EXIT), None), status, NOW + timedelta(days=3))
    assert not any(isinstance(a, DeleteJob) for a in later.actions), later.actions
    assert later.status.phase == "Failed" and later.status.results_pod == "rn50-worker-0"


def test_an_upload_done_later_makes_the_job_succeeded_and_frees_the_pod_that_kept_the_results() -> None:
    spec, status = failed_for_good({"ttlSecondsAfterFinished": 60, "cleanPodPolicy": "Running"})
    said = results_upload.done_line(3, 4096, 1) + " (dtjob results upload, 2026-11-28T09:00:00Z)"
    record = said.removeprefix(results_upload.LINE_PREFIX)
    observed = replace(
        world(failed_launcher(UPLOAD_FAILED_EXIT), None),
        results_uploaded_later=results_upload.uploaded_later(record),
    )
    at = NOW + timedelta(days=1)
    d = decide(spec, observed, status, at)
    assert d.status.phase == "Succeeded", d.status
    succeeded, failed = d.status.condition("Succeeded"), d.status.condition("Failed")
    assert succeeded is not None and succeeded.status == "True"
    assert succeeded.reason == "ResultsUploadedLater" and "3 files, 4096 bytes" in succeeded.message
    assert failed is not None and failed.status == "False"
    assert (d.status.results_state, d.status.results_pod) == ("Uploaded", None)
    assert d.status.to_dict()["output"]["results"]["keptOnPod"] is None, "null: the merge patch removes it"
    assert d.status.completion_time == format_time(at), "the TTL counts from the upload"
    deleted = {a.name for a in d.actions if isinstance(a, DeletePod)}
    assert "rn50-worker-0" in deleted, d.actions
    assert any(e.reason == "ResultsUploadedLater" for e in d.events), d.events
    assert not any(isinstance(a, DeleteJob) for a in d.actions)


def test_only_a_done_line_counts_as_uploaded_later() -> None:
    assert results_upload.uploaded_later(None) is None
    assert results_upload.uploaded_later("it is fine, trust me") is None
    assert results_upload.uploaded_later("failed after 3 tries in 9 s: 503") is None
    report = results_upload.uploaded_later("done: 1 files, 2 bytes, after 1 tries")
    assert report is not None and report.state == "Uploaded"


def test_a_record_on_a_job_that_kept_no_results_changes_nothing() -> None:
    spec = job_spec(output=OUTPUT)
    done = LauncherState(0, deleting=False, running=False, succeeded=False, failed=True, pod_name="l")
    observed = replace(
        world(done, None), results_uploaded_later=results_upload.uploaded_later("done: 1 files, 2 bytes")
    )
    status = JobStatus(phase="Failed", completion_time=format_time(NOW), logs_uploaded=True)
    d = decide(spec, observed, status, NOW)
    assert d.status.phase == "Failed" and d.status.results_state is None


def job_with_results(phase: str, results: dict[str, str] | None) -> dict[str, object]:
    status: dict[str, object] = {"phase": phase, "output": {"results": results} if results else {}}
    return {"metadata": {"name": "rn50", "uid": "uid-1"}, "status": status}


def test_the_cli_uploads_only_results_a_pod_kept_and_says_why_not_otherwise() -> None:
    kept = {"state": "Failed", "message": "failed after 9 tries", "keptOnPod": "rn50-worker-0"}
    assert kept_results_pod(job_with_results("Failed", kept)) == "rn50-worker-0"
    cases = {
        ("Succeeded", "Uploaded"): ("already uploaded", 0),
        ("Failed", "Failed"): ("no pod kept them", 4),
        ("Running", "Retrying"): ("it is Running, results Retrying", 2),
        ("Running", ""): ("no results upload yet", 2),
    }
    for (phase, state), (said, code) in cases.items():
        results = {"state": state, "message": "m"} if state else None
        try:
            kept_results_pod(job_with_results(phase, results))
        except StorageFailure as err:
            assert said in err.reason and int(err.code) == code, (phase, state, err)
        else:
            raise AssertionError(f"{phase}/{state}: no refusal")
