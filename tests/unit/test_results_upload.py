"""The results upload after training: the lines it prints, how the operator reads them into status, and an
upload that failed for good (an infrastructure failure that keeps the results, never a restart)."""

from __future__ import annotations

import argparse
import base64
import shlex
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs

import pytest
from dtjob.azure.errors import StorageFailure
from dtjob.cli.kept_results import UPLOAD_SAS_MARGIN, kept_results, kept_results_pod, upload_sas
from dtjob.contract import results_upload
from dtjob.contract.results_upload import UPLOAD_FAILED_EXIT, ResultsRecord, latest_report
from dtjob.desired.command import launcher_script
from dtjob.machine import decide
from dtjob.spec.parse import JobSpec
from dtjob.state.decision import DeleteJob, DeletePod
from dtjob.state.observed import LauncherState, Observed, PodState, SasObservation, StoredResults
from dtjob.state.status import JobStatus
from dtjob.timefmt import format_time

from tests.unit.operator_fixtures import job_spec

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
OUTPUT = {"account": "acct1", "container": "results", "credentials": {"authMode": "workloadIdentity"}}


def test_the_newest_line_says_the_state_and_a_retry_says_why() -> None:
    log = "\n".join([
        "[1,0]<stdout>:DTJOB_PROGRESS {}",
        results_upload.started_line("rn50-worker-0"),
        results_upload.retry_line(1, 2, 598, "storage refused: 503 Service Unavailable\nsecond line"),
    ])  # fmt: skip
    report = latest_report(log)
    assert report is not None and report.state == "Retrying"
    assert report.message == (
        "retrying in 2 s (try 1 failed, 598 s of retries left): storage refused: 503 Service Unavailable "
        "second line"
    )
    done = latest_report(log + "\n" + results_upload.done_line(3, 1024, 2, "rn50-worker-1"))
    assert done is not None and (done.state, done.pod) == ("Uploaded", "rn50-worker-1")
    assert results_upload.done_counts(done.message) == (3, 1024)
    assert latest_report("training only\n") is None
    started = latest_report(results_upload.started_line("rn50-worker-0"))
    assert started is not None and started.state == "Uploading"


def test_the_failed_line_names_the_pod_before_its_reason_which_cannot_forge_it() -> None:
    line = results_upload.failed_line(3, 70, "refused on pod rn50-worker-7: 503", "rn50-worker-2")
    report = latest_report(line)
    assert report is not None and (report.state, report.pod) == ("Failed", "rn50-worker-2")
    # A line of an uploader that names no pod: the pod is not known from it.
    old = latest_report("dtjob results upload: failed after 3 tries in 70 s: on pod rn50-worker-7: 503")
    assert old is not None and (old.state, old.pod) == ("Failed", None)


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
        PodState(
            f"rn50-worker-{i}", "worker", 0, i, "Running", scheduled=True, ready=True, deleting=False,
            uid=f"pod-uid-{i}",
        )
        for i in range(2)
    )  # fmt: skip
    report = latest_report(log) if log is not None else None
    # The output SAS the policy allowed: status names the run's location.
    sas = {"out": SasObservation(mint_needed=False, rotate_in_s=600)}
    return Observed(pods=workers, launcher=launcher, results_upload=report, uid="uid-1", sas=sas)


def running() -> JobStatus:
    return JobStatus(phase="Running", start_time=format_time(NOW - timedelta(hours=10)), launcher_pod="x")


FAILED_LOG = results_upload.failed_line(9, 600, "storage refused: 503 Service Unavailable", "rn50-worker-0")


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
    assert d.status.results_pod_uid == "pod-uid-0"
    # Once the logs are up, cleanPodPolicy Running frees every running pod but the one holding the results.
    after = decide(
        spec, world(failed_launcher(UPLOAD_FAILED_EXIT), None), d.status, NOW + timedelta(minutes=6)
    )
    deleted = {a.name for a in after.actions if isinstance(a, DeletePod)}
    assert deleted == {"rn50-worker-1"}, after.actions


ELASTIC = {
    "elastic": {"minWorkers": 1, "maxWorkers": 2},
    "runPolicy": {"cleanPodPolicy": "Running"},
    "output": OUTPUT,
}


def test_an_elastic_world_keeps_the_pod_its_upload_ran_on_and_only_while_it_lives() -> None:
    spec = job_spec(**ELASTIC)
    moved = results_upload.failed_line(9, 600, "storage refused: 503", "rn50-worker-1")
    d = decide(spec, world(failed_launcher(UPLOAD_FAILED_EXIT), moved), running(), NOW)
    assert (d.status.results_pod, d.status.results_pod_uid) == ("rn50-worker-1", "pod-uid-1"), d.status
    failed = d.status.condition("Failed")
    assert failed is not None and "kept on pod rn50-worker-1" in failed.message
    # An uploader that names no pod: an elastic world's rank 0 could be anywhere, so no pod is claimed.
    unnamed = "dtjob results upload: failed after 9 tries in 600 s: storage refused: 503"
    d = decide(spec, world(failed_launcher(UPLOAD_FAILED_EXIT), unnamed), running(), NOW)
    assert d.status.results_pod is None and d.status.phase == "Failed"
    failed = d.status.condition("Failed")
    assert failed is not None and "did not say which pod" in failed.message
    # The pod the upload ran on is gone (a name the log gives that no live pod of this world has).
    gone = results_upload.failed_line(9, 600, "storage refused: 503", "rn50-worker-7")
    d = decide(spec, world(failed_launcher(UPLOAD_FAILED_EXIT), gone), running(), NOW)
    assert d.status.results_pod is None
    failed = d.status.condition("Failed")
    assert failed is not None and "pod rn50-worker-7, which held the results, is gone" in failed.message


def test_cleanup_spares_the_kept_pod_by_uid_not_a_later_one_of_its_name() -> None:
    spec, status = failed_for_good({"cleanPodPolicy": "Running"})
    observed = world(failed_launcher(UPLOAD_FAILED_EXIT), None)
    renamed = tuple(replace(p, uid="pod-uid-new") if p.name == "rn50-worker-0" else p for p in observed.pods)
    d = decide(spec, replace(observed, pods=renamed), status, NOW + timedelta(minutes=6))
    assert {a.name for a in d.actions if isinstance(a, DeletePod)} == {"rn50-worker-0", "rn50-worker-1"}


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
    d2 = decide(spec, world(done, results_upload.done_line(2, 10, 3, "rn50-worker-0")), d.status, NOW)
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


def record_of(status: JobStatus, **changed: object) -> ResultsRecord:
    """The record `dtjob results upload` writes for the results `status` keeps, `changed` as a forger or
    an older job's manifest would have it."""
    assert status.results_pod is not None and status.results_pod_uid is not None
    record = ResultsRecord(
        "uid-1", status.restarts, status.results_pod, status.results_pod_uid, 3, 4096, "2026-11-28T09:00:00Z"
    )
    return replace(record, **changed)  # type: ignore[arg-type]


STORED = StoredResults(True, "3 files, 4096 bytes under https://acct1.blob.core.windows.net/results/x/")


def test_an_upload_done_later_makes_the_job_succeeded_and_frees_the_pod_that_kept_the_results() -> None:
    spec, status = failed_for_good({"ttlSecondsAfterFinished": 60, "cleanPodPolicy": "Running"})
    observed = replace(
        world(failed_launcher(UPLOAD_FAILED_EXIT), None),
        results_record=record_of(status),
        results_stored=STORED,
    )
    at = NOW + timedelta(days=1)
    d = decide(spec, observed, status, at)
    assert d.status.phase == "Succeeded", d.status
    succeeded, failed = d.status.condition("Succeeded"), d.status.condition("Failed")
    assert succeeded is not None and succeeded.status == "True"
    assert succeeded.reason == "ResultsUploadedLater" and "3 files, 4096 bytes" in succeeded.message
    assert failed is not None and failed.status == "False"
    assert (d.status.results_state, d.status.results_pod, d.status.results_pod_uid) == (
        "Uploaded",
        None,
        None,
    )
    kept = d.status.to_dict()["output"]["results"]
    assert kept["keptOnPod"] is None and kept["keptOnPodUID"] is None, "null: the merge patch removes them"
    assert d.status.completion_time == format_time(at), "the TTL counts from the upload"
    deleted = {a.name for a in d.actions if isinstance(a, DeletePod)}
    assert "rn50-worker-0" in deleted, d.actions
    assert any(e.reason == "ResultsUploadedLater" for e in d.events), d.events
    assert not any(isinstance(a, DeleteJob) for a in d.actions)


def test_a_record_about_another_run_or_whose_results_storage_lacks_changes_nothing() -> None:
    spec, status = failed_for_good({"cleanPodPolicy": "Running"})
    missing = StoredResults(False, "no .dtjob-results.json under https://acct1.blob.core.windows.net/x/")
    cases = {
        "an older job of the same name's": (
            record_of(status, job_uid="uid-0"),
            STORED,
            "ResultsRecordIgnored",
        ),
        "another attempt's": (record_of(status, attempt=1), STORED, "ResultsRecordIgnored"),
        "another pod's of the same name": (
            record_of(status, pod_uid="pod-uid-9"),
            STORED,
            "ResultsRecordIgnored",
        ),
        "a forger's, storage lacking the results": (record_of(status), missing, "ResultsNotInStorage"),
    }
    for case, (record, stored, reason) in cases.items():
        observed = replace(
            world(failed_launcher(UPLOAD_FAILED_EXIT), None), results_record=record, results_stored=stored
        )
        d = decide(spec, observed, status, NOW + timedelta(days=1))
        assert d.status.phase == "Failed" and d.status.results_pod == "rn50-worker-0", case
        assert d.status.results_pod_uid == "pod-uid-0", case
        assert "rn50-worker-0" not in {a.name for a in d.actions if isinstance(a, DeletePod)}, case
        assert [e.reason for e in d.events] == [reason], (case, d.events)


def test_a_check_storage_could_not_answer_is_tried_again() -> None:
    spec, status = failed_for_good({"cleanPodPolicy": "Running"})
    away = StoredResults(False, "could not look for the results: 503", retry=True)
    observed = replace(
        world(failed_launcher(UPLOAD_FAILED_EXIT), None),
        results_record=record_of(status),
        results_stored=away,
    )
    d = decide(spec, observed, status, NOW)
    assert d.status.phase == "Failed" and d.requeue_after is not None and d.requeue_after <= 30


def test_only_a_record_with_every_field_counts() -> None:
    record = ResultsRecord("uid-1", 0, "rn50-worker-0", "pod-uid-0", 3, 4096, "2026-11-28T09:00:00Z")
    assert results_upload.parse_record(record.to_annotation()) == record
    for text in (None, "", "done: 1 files, 2 bytes, after 1 tries", "[]", '{"jobUID": "uid-1"}',
                 record.to_annotation().replace('"files":3', '"files":-3'),
                 record.to_annotation().replace('"attempt":0', '"attempt":true'),
                 record.to_annotation() + " " * 2000):  # fmt: skip
        assert results_upload.parse_record(text) is None, text


def test_a_manifest_round_trips_and_anything_else_is_none() -> None:
    files = {"model/final.pt": 80_000, "metrics.json": 14}
    assert results_upload.parse_manifest(results_upload.manifest_text(files)) == files
    for text in ("", "{}", '{"files": []}', '{"files": {"a": -1}}', '{"files": {"a": "1"}}', "[1]"):
        assert results_upload.parse_manifest(text) is None, text


def test_a_record_on_a_job_that_kept_no_results_changes_nothing() -> None:
    spec = job_spec(output=OUTPUT)
    done = LauncherState(0, deleting=False, running=False, succeeded=False, failed=True, pod_name="l")
    record = ResultsRecord("uid-1", 0, "rn50-worker-0", "pod-uid-0", 1, 2, "2026-11-28T09:00:00Z")
    observed = replace(world(done, None), results_record=record, results_stored=STORED)
    status = JobStatus(phase="Failed", completion_time=format_time(NOW), logs_uploaded=True)
    d = decide(spec, observed, status, NOW)
    assert d.status.phase == "Failed" and d.status.results_state is None


def job_with_results(
    phase: str, results: dict[str, str] | None, output: dict[str, object] | None = None
) -> dict[str, object]:
    status: dict[str, object] = {"phase": phase, "output": {**(output or {}), "results": results or {}}}
    meta = {"name": "rn50", "namespace": "team-a", "uid": "uid-1"}
    return {"metadata": meta, "spec": {"output": {**OUTPUT, "prefix": "runs"}}, "status": status}


KEPT = {
    "state": "Failed",
    "message": "failed after 9 tries",
    "keptOnPod": "rn50-worker-1",
    "keptOnPodUID": "p-1",
}


def test_the_cli_uploads_only_results_a_pod_kept_and_says_why_not_otherwise() -> None:
    assert kept_results_pod(job_with_results("Failed", KEPT)) == ("rn50-worker-1", "p-1")
    cases = {
        ("Succeeded", "Uploaded"): ("already uploaded", 0),
        ("Failed", "Failed"): ("no pod the operator can name kept them", 4),
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


RUN_URL = "https://acct1.blob.core.windows.net/results/runs/team-a/rn50/uid-1/"


def test_the_cli_uploads_only_to_the_runs_location_the_policy_allowed_and_as_narrowly_as_status_says() -> (
    None
):
    kept = kept_results(job_with_results("Failed", KEPT, {"url": RUN_URL, "sasScope": "Directory"}))
    assert (kept.pod, kept.pod_uid, kept.job_uid, kept.attempt) == ("rn50-worker-1", "p-1", "uid-1", 0)
    assert kept.prefix == "runs/team-a/rn50/uid-1/" and kept.directory_scoped
    flat = kept_results(job_with_results("Failed", KEPT, {"url": RUN_URL, "sasScope": "Container"}))
    assert not flat.directory_scoped
    # spec.output edited after the run (another container): the status still names the run's location.
    moved = job_with_results("Failed", KEPT, {"url": RUN_URL})
    moved["spec"] = {"output": {**OUTPUT, "container": "shared", "prefix": "runs"}}
    try:
        kept_results(moved)
    except StorageFailure as err:
        assert int(err.code) == 2 and "not the run's location" in err.reason, err
    else:
        raise AssertionError("an upload signed for a location the operator never allowed")


def test_the_clis_upload_token_is_create_write_for_the_runs_directory_where_it_can_be_and_short_lived(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AZURE_STORAGE_SAS_TOKEN", raising=False)
    key = base64.b64encode(b"k" * 64).decode()
    args = argparse.Namespace(sas=None, account_key=key, retry_for=600)
    before = datetime.now(UTC)
    for scope, resource in (("Directory", "d"), ("Container", "c")):
        kept = kept_results(job_with_results("Failed", KEPT, {"url": RUN_URL, "sasScope": scope}))
        token = parse_qs(upload_sas(args, kept))
        assert (token["sp"], token["sr"]) == (["cw"], [resource]), token
        assert ("sdd" in token) == (resource == "d"), token  # the run's directory, 4 levels deep
        expiry = datetime.strptime(token["se"][0], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        assert expiry - before <= timedelta(seconds=600) + UPLOAD_SAS_MARGIN + timedelta(seconds=5), expiry
