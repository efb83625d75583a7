"""The Staging phase and storage cleanup in the pure state machine, and the storage fields of parse_spec."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from dtjob.contract.transfer_report import ProgressSnapshot
from dtjob.machine import decide, with_results
from dtjob.spec.parse import SpecError
from dtjob.state.decision import (
    CreateStagingJob,
    CreateWorker,
    DeleteSasSecrets,
    SasSecretsDeleted,
    UploadLogs,
)
from dtjob.state.observed import Observed
from dtjob.state.staging import StagingOutcome
from dtjob.state.status import JobStatus
from dtjob.timefmt import format_time

from tests.unit.operator_fixtures import job_spec

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
CREDS = {"authMode": "accountKey", "secretRef": {"name": "storage-key"}}
VOLUME = {"nfs": {"server": "10.0.0.4", "path": "/exports"}, "mountPath": "/data"}


def staged_spec(**extra: Any) -> Any:
    dataset = {
        "source": "imagenet",
        "volume": VOLUME,
        "dataDir": "/data/imagenet",
        "stageFrom": {"account": "acct1", "container": "datasets", "prefix": "in", "credentials": CREDS},
    }
    return job_spec(dataset=dataset, **extra)


def test_staging_comes_before_any_worker() -> None:
    d = decide(staged_spec(), Observed(), JobStatus(), NOW)
    assert d.actions == [CreateStagingJob()]
    assert d.status.phase == "Staging"
    assert "datasets/in to /data/imagenet" in d.status.message


def test_running_staging_reports_progress() -> None:
    snap = ProgressSnapshot("transferring", 10, 3, 1, 1000, 300, 100, 5.0, 80.0)
    d = decide(
        staged_spec(), Observed(staging=StagingOutcome("Running", snap)), JobStatus(phase="Staging"), NOW
    )
    assert d.actions == []
    assert d.status.staging is not None and d.status.staging["filesCompleted"] == 4
    assert "4/10 files" in d.status.message and d.requeue_after is not None


def test_a_stager_waiting_for_another_on_its_destination_says_so() -> None:
    snap = ProgressSnapshot("waiting", 0, 0, 0, 0, 0, 0, 3.0, 0.0, "waiting for another stager writing /data")
    d = decide(
        staged_spec(), Observed(staging=StagingOutcome("Running", snap)), JobStatus(phase="Staging"), NOW
    )
    assert d.status.phase == "Staging" and d.actions == []
    assert d.status.staging == {**snap.to_status(), "phase": "waiting"}
    assert d.status.message.endswith(": waiting for another job's stager writing there to finish")


def test_staged_creates_the_world_and_is_remembered() -> None:
    d = decide(
        staged_spec(), Observed(staging=StagingOutcome("Succeeded", None)), JobStatus(phase="Staging"), NOW
    )
    assert d.status.is_true("Staged")
    assert CreateWorker(0, 0) in d.actions and CreateStagingJob() not in d.actions
    again = decide(staged_spec(), Observed(staging=None), d.status, NOW)
    assert CreateStagingJob() not in again.actions


def test_failed_staging_fails_the_job_with_its_reason() -> None:
    reason = "input SAS denied (403): check Secret rn50-sas-in"
    d = decide(
        staged_spec(),
        Observed(staging=StagingOutcome("Failed", None, reason)),
        JobStatus(phase="Staging"),
        NOW,
    )
    assert d.status.phase == "Failed"
    failed = d.status.condition("Failed")
    assert failed is not None and failed.reason == "StagingFailed" and reason in failed.message
    assert not any(isinstance(a, CreateWorker) for a in d.actions)
    assert DeleteSasSecrets() in d.actions


def test_finished_job_uploads_logs_before_cleanup_then_revokes_sas() -> None:
    output = {"account": "acct1", "container": "results", "credentials": CREDS}
    spec = job_spec(output=output)
    finished = JobStatus(
        phase="Succeeded",
        start_time=format_time(NOW),
        completion_time=format_time(NOW),
        output_url="https://acct1.blob.core.windows.net/results/ml/rn50/u-1/",
    )
    first = decide(spec, Observed(), finished, NOW)
    assert first.actions == [UploadLogs()]
    uploaded = decide(spec, Observed(), JobStatus(**{**finished.__dict__, "logs_uploaded": True}), NOW)
    assert uploaded.actions[0] == DeleteSasSecrets()
    # sasSecretsDeleted is written only once the delete has happened, from the action's result.
    assert not uploaded.status.sas_secrets_deleted
    recorded, _ = with_results(uploaded.status, [SasSecretsDeleted()])
    assert recorded.sas_secrets_deleted
    # Logs that cannot be uploaded stop holding cleanup after the grace period.
    late = decide(spec, Observed(), finished, NOW + timedelta(minutes=6))
    assert UploadLogs() not in late.actions and DeleteSasSecrets() in late.actions


@pytest.mark.parametrize(
    ("dataset", "path"),
    [
        ({"stageFrom": {"account": "acct1", "container": "datasets", "credentials": CREDS}},
         "spec.dataset.volume"),
        ({"volume": VOLUME, "stageFrom": {"account": "acct1", "container": "d", "credentials": CREDS}},
         "spec.dataset.stageFrom.container"),
        ({"volume": VOLUME, "stageFrom": {"account": "acct1", "container": "datasets", "destination": "/tmp",
                                          "credentials": CREDS}}, "spec.dataset.stageFrom.destination"),
    ],
)  # fmt: skip
def test_storage_spec_errors_name_the_field(dataset: dict[str, Any], path: str) -> None:
    with pytest.raises(SpecError) as err:
        job_spec(dataset=dataset)
    assert err.value.path == path
