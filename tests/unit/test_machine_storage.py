"""The state machine's storage rules: SAS mints and rotations as actions, results recorded after they ran."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dtjob.machine import decide, with_results
from dtjob.state.decision import (
    CreateWorker,
    DeleteSasSecrets,
    EnsureWorld,
    LogsUploaded,
    MintSas,
    SasSecretsDeleted,
    UploadLogs,
)
from dtjob.state.observed import Blocker, Observed, SasObservation
from dtjob.state.status import JobStatus
from dtjob.timefmt import format_time

from tests.unit.operator_fixtures import job_spec

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
CREDS = {"authMode": "accountKey", "secretRef": {"name": "storage-key"}}
OUTPUT = {"account": "acct1", "container": "results", "credentials": CREDS}
RUN_URL = "https://acct1.blob.core.windows.net/results/ml/rn50/u-1/"


def test_a_missing_sas_is_minted_before_anything_that_mounts_it() -> None:
    spec = job_spec(output=OUTPUT)
    d = decide(spec, Observed(sas={"out": SasObservation(mint_needed=True)}), JobStatus(), NOW)
    assert d.actions[0] == MintSas("out", not_after=None)
    assert d.actions[1:3] == [EnsureWorld(), CreateWorker(0, 0)]


def test_the_token_never_outlives_the_active_deadline() -> None:
    spec = job_spec(output=OUTPUT, runPolicy={"activeDeadlineSeconds": 600})
    d = decide(spec, Observed(sas={"out": SasObservation(mint_needed=True)}), JobStatus(), NOW)
    assert d.actions[0] == MintSas("out", not_after=NOW + timedelta(seconds=600))


def test_a_fresh_sas_is_looked_at_again_when_its_rotation_is_due() -> None:
    spec = job_spec(output=OUTPUT)
    d = decide(
        spec, Observed(sas={"out": SasObservation(mint_needed=False, rotate_in_s=1234)}), JobStatus(), NOW
    )
    assert not any(isinstance(a, MintSas) for a in d.actions)
    assert d.requeue_after == 1234


def test_credentials_that_stop_a_mint_keep_the_first_world_from_being_created() -> None:
    blocker = Blocker("StorageCredentialsNotFound", "spec.output.credentials.secretRef: Secret 'k' not found")
    obs = Observed(sas={"out": SasObservation(mint_needed=True, blocked=blocker)}, blocker=blocker)
    d = decide(job_spec(output=OUTPUT), obs, JobStatus(), NOW)
    assert d.actions == []
    assert d.status.phase == "Pending" and "Secret 'k' not found" in d.status.message


def test_a_running_world_whose_rotation_is_blocked_keeps_running_and_retries() -> None:
    started = JobStatus(phase="Running", start_time=format_time(NOW - timedelta(hours=1)))
    blocker = Blocker("StorageCredentialsNotFound", "Secret 'k' not found")
    obs = Observed(sas={"out": SasObservation(mint_needed=True, blocked=blocker)}, blocker=blocker)
    d = decide(job_spec(output=OUTPUT), obs, started, NOW)
    assert not any(isinstance(a, MintSas) for a in d.actions)
    assert d.status.phase != "Failed" and d.requeue_after is not None and d.requeue_after <= 15


def test_the_results_url_and_training_progress_come_from_what_was_observed() -> None:
    progress = {"epoch": 1, "step": 3, "stepsPerEpoch": 10}
    out = {"out": SasObservation(mint_needed=True)}
    obs = Observed(uid="u-1", training_progress=progress, sas=out, output_sas_scope="Container")
    d = decide(job_spec(output=OUTPUT), obs, JobStatus(), NOW)
    assert d.status.output_url is not None and d.status.output_url.endswith("/ml/rn50/u-1/")
    assert d.status.to_dict()["output"]["sasScope"] == "Container"
    assert d.status.to_dict()["progress"] == progress


def test_the_results_url_names_only_a_location_the_output_sas_may_be_signed_for() -> None:
    """status.output.url is what `dtjob results upload` signs for: never a location the storage policy
    refused (a spec.output edited mid-run to another container), and a finished job's stays its run's."""
    refused = Blocker("StorageNotAllowed", "spec.output.container: 'imagenet' is not writable", fatal=True)
    running = JobStatus(phase="Running", start_time=format_time(NOW), output_url="https://a/results/r/")
    edited = job_spec(output={**OUTPUT, "container": "imagenet"})
    obs = Observed(uid="u-1", sas={"out": SasObservation(mint_needed=True, blocked=refused)}, blocker=refused)
    assert decide(edited, obs, running, NOW).status.output_url == "https://a/results/r/"
    finished = JobStatus(phase="Failed", completion_time=format_time(NOW), output_url="https://a/results/r/")
    assert decide(edited, Observed(uid="u-1"), finished, NOW).status.output_url == "https://a/results/r/"
    never = decide(edited, obs, JobStatus(), NOW)
    assert never.status.phase == "Failed" and never.status.output_url is None
    assert not any(isinstance(a, UploadLogs) for a in never.actions), "no logs to a location never allowed"


def test_the_final_log_upload_is_recorded_from_its_result() -> None:
    done = JobStatus(
        phase="Succeeded", start_time=format_time(NOW), completion_time=format_time(NOW), output_url=RUN_URL
    )
    d = decide(job_spec(output=OUTPUT), Observed(), done, NOW)
    assert d.actions == [UploadLogs()] and not d.status.logs_uploaded
    result = LogsUploaded(None, True, "https://a/results/logs/", missing=("rn50-worker-1",))
    status, events = with_results(d.status, [result])
    assert status.logs_uploaded and status.logs_missing == ("rn50-worker-1",)
    assert [e.reason for e in events] == ["LogsUploaded"] and "not readable: rn50-worker-1" in events[
        0
    ].message
    failed, _ = with_results(d.status, [LogsUploaded(None, False, "x/logs/", error="timed out")])
    assert not failed.logs_uploaded and failed.logs_error == "timed out"
    # A failing upload is retried, but not every second.
    again = decide(job_spec(output=OUTPUT), Observed(), failed, NOW + timedelta(seconds=5))
    assert again.actions == [UploadLogs()] and again.requeue_after == 10


def test_a_failed_worlds_logs_that_cannot_be_uploaded_are_said_once() -> None:
    status, events = with_results(JobStatus(), [LogsUploaded(2, False, "u/logs/attempt-2/", error="403")])
    assert status == JobStatus()
    assert [(e.type, e.reason) for e in events] == [("Warning", "LogsNotUploaded")]


def test_sas_secrets_deleted_is_recorded_only_after_the_delete() -> None:
    done = JobStatus(
        phase="Failed", start_time=format_time(NOW), completion_time=format_time(NOW), logs_uploaded=True
    )
    d = decide(job_spec(output=OUTPUT), Observed(), done, NOW)
    assert DeleteSasSecrets() in d.actions and not d.status.sas_secrets_deleted
    # An operator killed before recording it deletes again on its next pass (delete-if-present).
    assert DeleteSasSecrets() in decide(job_spec(output=OUTPUT), Observed(), d.status, NOW).actions
    recorded, _ = with_results(d.status, [SasSecretsDeleted()])
    assert DeleteSasSecrets() not in decide(job_spec(output=OUTPUT), Observed(), recorded, NOW).actions
