"""Pure builders of the staging Job and SAS mounts, and reading a stager's outcome from its pod."""

from __future__ import annotations

from typing import Any

from dtjob.contract.transfer_report import ProgressSnapshot
from dtjob.desired.command import results_upload_command
from dtjob.desired.pods import sas_volume, sas_volume_mount
from dtjob.desired.staging import staging_job
from dtjob.names import Access
from dtjob.state.staging import staging_outcome

from tests.unit.operator_fixtures import job_spec

OWNER = {"apiVersion": "dtjob.io/v1alpha1", "kind": "DistributedTrainingJob", "name": "r50", "uid": "u1"}
# The dataset volume as the stager mounts it: writable, whatever the workers get.
NFS = {"name": "data", "nfs": {"server": "10.0.0.4", "path": "/export", "readOnly": False}}
STAGE_FROM = {
    "account": "acct1",
    "container": "datasets",
    "prefix": "ilsvrc2012",
    "concurrency": 16,
    "credentials": {"authMode": "workloadIdentity"},
}


def build(volume: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    dataset = {
        "source": "imagenet",
        "volume": volume or {"nfs": {"server": "10.0.0.4", "path": "/export"}, "mountPath": "/data"},
        "dataDir": "/data/imagenet",
        "stageFrom": STAGE_FROM,
    }
    return staging_job(job_spec(name="r50", namespace="team-a", dataset=dataset, **spec), OWNER, "stager:1")


def test_staging_job_mounts_the_volume_and_the_read_sas_only() -> None:
    job = build(placement={"launcher": {"nodePool": "system"}}, runPolicy={"activeDeadlineSeconds": 3600})
    assert job["metadata"]["name"] == "r50-stage"
    assert job["metadata"]["ownerReferences"] == [OWNER]
    assert job["metadata"]["labels"]["dtjob.io/role"] == "stager"
    assert job["metadata"]["labels"]["dtjob.io/job-name"] == "r50"
    assert job["spec"]["activeDeadlineSeconds"] == 3600
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["nodeSelector"] == {"kubernetes.azure.com/agentpool": "system"}
    assert pod["volumes"] == [
        NFS,
        {"name": "sas-in", "secret": {"secretName": "r50-sas-in", "defaultMode": 0o440}},
    ]
    (container,) = pod["containers"]
    assert container["volumeMounts"] == [
        {"name": "data", "mountPath": "/data"},
        {"name": "sas-in", "mountPath": "/var/run/dtjob/sas-in", "readOnly": True},
    ]
    assert all("subPath" not in m for m in container["volumeMounts"])
    args = container["args"]
    assert args[0] == "download"
    assert args[args.index("--sas-file") + 1] == "/var/run/dtjob/sas-in/sas-token"
    assert args[args.index("--container-url-file") + 1] == "/var/run/dtjob/sas-in/container-url"
    assert args[args.index("--dest") + 1] == "/data/imagenet"
    assert args[args.index("--credentials-hint") + 1] == "Secret r50-sas-in"
    assert "env" not in container  # no credentials in env, ever
    assert "sas-out" not in str(job)


def test_the_stager_container_is_locked_down_and_runs_as_the_stager_images_user() -> None:
    pod = build()["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    context = {"runAsNonRoot": True, "runAsUser": 65532, "fsGroup": 65532}
    assert context.items() <= pod["securityContext"].items()
    assert "nodeSelector" not in pod  # the default CPU pool (""): any node without a taint it lacks


def test_the_stager_mounts_a_read_only_dataset_volume_writable() -> None:
    read_only = {"nfs": {"server": "10.0.0.4", "path": "/export", "readOnly": True}, "mountPath": "/data"}
    volumes = build(volume=read_only)["spec"]["template"]["spec"]["volumes"]
    assert volumes[0] == {"name": "data", "nfs": {"server": "10.0.0.4", "path": "/export", "readOnly": False}}
    assert read_only["nfs"]["readOnly"] is True  # the caller's dict is untouched


def test_results_upload_uses_the_write_sas() -> None:
    cmd = results_upload_command("r50", "/output", "runs/team-a/r50/u1/")
    assert cmd[:4] == ["python", "-m", "dtjob.stager", "upload"]
    assert cmd[cmd.index("--sas-file") + 1] == "/var/run/dtjob/sas-out/sas-token"
    assert cmd[cmd.index("--prefix") + 1] == "runs/team-a/r50/u1/"
    assert sas_volume("r50", Access.OUTPUT)["secret"]["secretName"] == "r50-sas-out"
    assert sas_volume_mount(Access.OUTPUT)["mountPath"] == "/var/run/dtjob/sas-out"


def pod(exit_code: int | None, message: str = "") -> dict[str, Any]:
    state = (
        {"terminated": {"exitCode": exit_code, "message": message}}
        if exit_code is not None
        else {"running": {}}
    )
    return {"status": {"containerStatuses": [{"name": "stager", "state": state}]}}


def job_status(condition: str | None) -> dict[str, Any]:
    conditions = (
        [{"type": condition, "status": "True", "reason": "BackoffLimitExceeded"}] if condition else []
    )
    return {"status": {"conditions": conditions}}


SNAP = ProgressSnapshot("done", 6, 6, 0, 100, 100, 0, 1.5, 66.7)


def test_outcome_succeeded_carries_the_final_progress() -> None:
    out = staging_outcome(job_status("Complete"), [pod(0, SNAP.to_json())])
    assert out.phase == "Succeeded"
    assert out.progress == SNAP
    assert out.progress is not None
    assert out.progress.to_status()["filesCompleted"] == 6


def test_outcome_failed_reports_the_stagers_reason() -> None:
    reason = "input container data: access denied (403 AuthorizationFailure): check Secret r50-sas-in"
    failed = ProgressSnapshot("failed", 6, 0, 0, 100, 0, 0, 0.4, 0.0, reason)
    out = staging_outcome(job_status("Failed"), [pod(3, failed.to_json())])
    assert (out.phase, out.reason) == ("Failed", reason)


def test_outcome_failed_without_a_message_maps_the_exit_code() -> None:
    out = staging_outcome(job_status("Failed"), [pod(4, "Traceback ...")])
    assert out.reason == "the input container or prefix does not exist"
    out = staging_outcome(job_status("Failed"), [pod(137)])
    assert out.reason == "the stager exited with status 137"
    out = staging_outcome(job_status("Failed"), [])
    assert out.reason == "staging Job failed: BackoffLimitExceeded"


def test_outcome_running_reads_live_progress_from_the_log() -> None:
    live = ProgressSnapshot("transferring", 10, 3, 2, 1000, 300, 200, 4.0, 75.0)
    log = f"starting\nDTJOB_PROGRESS {live.to_json()}\nnoise\n"
    out = staging_outcome(job_status(None), [pod(None)], log)
    assert out.phase == "Running"
    assert out.progress == live
    assert staging_outcome(job_status(None), [pod(None)]).progress is None
