"""The operator with Blob Storage: a real API server (kwok-simulated pods) and a real Azurite.

Covers the Staging phase (progress in status, success, a failed stager), the per-job SAS Secrets (created
before anything mounts them, rotated before expiry, deleted at the end), pod logs uploaded to the output
prefix before cleanup, and that no account key or SAS signature reaches a pod spec, event, status or
operator log.
"""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from azure.storage.blob import BlobServiceClient
from dtjob.azure.sas import ANNOTATION_EXPIRES, ANNOTATION_ISSUED
from dtjob.contract import results_upload
from dtjob.contract.results_upload import UPLOAD_FAILED_EXIT
from dtjob.contract.transfer_report import PROGRESS_MARKER, ProgressSnapshot
from dtjob.names import STORAGE_KEY_LABEL
from dtjob.spec.tenancy import (
    ANNOTATION_CLIENT_IDS,
    ANNOTATION_CONTAINERS,
    ANNOTATION_READ_CONTAINERS,
    ANNOTATION_WRITE_CONTAINERS,
)
from dtjob.timefmt import parse_time
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed.azurite import DEV_ACCOUNT_NAME, Azurite
from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess
from testbed.sim_logs import append_log, serve_pod_log
from tests.azure.conftest import azurite, container_name  # noqa: F401  (fixtures: Azurite, a fresh name)

pytestmark = [pytest.mark.integration, pytest.mark.azure]

KEY_SECRET = "storage-key"
# Short SAS lives with an early rotation, so a test sees a rotation within seconds.
LIFETIME_S = 300
ROTATE_FRACTION = "0.05"  # rotate 15 s after issue


@pytest.fixture
def operator_env() -> dict[str, str]:
    # The installer allows Azurite's account (no storage account is allowed by default).
    return {
        "DTJOB_SAS_ROTATE_FRACTION": ROTATE_FRACTION,
        "DTJOB_ALLOWED_STORAGE_ACCOUNTS": DEV_ACCOUNT_NAME,
        "DTJOB_WRITE_CONTAINERS": "*",
    }


@pytest.fixture
def blob(azurite: Azurite) -> BlobServiceClient:  # noqa: F811
    return BlobServiceClient(azurite.endpoint, credential=azurite.account_key)


def key_secret(jobs: Jobs, azurite: Azurite, opt_in: bool = True) -> None:  # noqa: F811
    """The account key Secret; `opt_in`: labelled for the operator's use, as the docs tell users to."""
    labels = {STORAGE_KEY_LABEL: "true"} if opt_in else {}
    secret = client.V1Secret(
        metadata=client.V1ObjectMeta(name=KEY_SECRET, labels=labels),
        string_data={"azurestorageaccountkey": azurite.account_key},
    )
    jobs.core.create_namespaced_secret(jobs.ns, secret)


def location(azurite: Azurite, container: str, prefix: str) -> dict[str, Any]:  # noqa: F811
    return {
        "endpoint": azurite.endpoint,
        "container": container,
        "prefix": prefix,
        "sasLifetimeSeconds": LIFETIME_S,
        "credentials": {"authMode": "accountKey", "secretRef": {"name": KEY_SECRET}},
    }


def storage_spec(
    azurite: Azurite,  # noqa: F811
    stage_annotations: dict[str, str],
    launcher_annotations: dict[str, str],
    output: str | None = None,
) -> dict[str, Any]:
    """A staged job; `output` names the results container (None: no spec.output)."""
    spec: dict[str, Any] = {
        "dataset": {
            "source": "imagenet",
            "volume": {"nfs": {"server": "10.0.0.4", "path": "/exports/imagenet"}, "mountPath": "/data"},
            "dataDir": "/data/imagenet",
            "stageFrom": {**location(azurite, "datasets", "ilsvrc2012"), "podAnnotations": stage_annotations},
        },
        "launcher": {"podAnnotations": launcher_annotations},
    }
    if output is not None:
        spec["output"] = location(azurite, output, "runs")
    return spec


def running_job_with_output(
    jobs: Jobs,
    azurite: Azurite,  # noqa: F811
    blob: BlobServiceClient,
    container: str,
    name: str,
    output: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A job writing to the fresh `container` (`output`: more of spec.output), its launcher simulated running
    for ten minutes, once both its workers are live; the job as created."""
    blob.create_container(container)
    key_secret(jobs, azurite)
    created = jobs.create(
        name,
        output={**location(azurite, container, "runs"), **(output or {})},
        launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}},
        **spec,
    )
    wait_for(lambda: len(jobs.live_workers(name)) == 2, timeout=90, what="workers")
    return created


def launcher_pod_of(jobs: Jobs, name: str) -> client.V1Pod:
    pod: client.V1Pod = wait_for(
        lambda: next(iter(jobs.pods(name, "launcher")), None), timeout=90, what="the launcher pod"
    )
    return pod


def secret_files(jobs: Jobs, name: str) -> dict[str, str] | None:
    try:
        secret = jobs.core.read_namespaced_secret(name, jobs.ns)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}


def stager_pod(jobs: Jobs, name: str) -> client.V1Pod | None:
    pods = jobs.pods(name, "stager")
    return pods[0] if pods else None


def sanitized(api_client: client.ApiClient, obj: Any) -> str:
    return json.dumps(api_client.sanitize_for_serialization(obj))


def assert_no_secrets_leaked(
    jobs: Jobs, api_client: client.ApiClient, name: str, operator: OperatorProcess, key: str
) -> None:
    """Nothing the operator wrote or created carries the account key or a SAS signature."""
    places = {
        "pods": sanitized(api_client, jobs.core.list_namespaced_pod(jobs.ns)),
        "jobs": sanitized(api_client, jobs.batch.list_namespaced_job(jobs.ns)),
        "events": sanitized(api_client, jobs.core.list_namespaced_event(jobs.ns)),
        "status": json.dumps(jobs.status(name)),
        "operator log": operator.log_path.read_text(errors="replace"),
    }
    for where, text in places.items():
        assert key not in text, f"the account key appears in {where}"
        assert "sig=" not in text, f"a SAS signature appears in {where}"


def test_staged_job_runs_uploads_logs_and_revokes_its_sas(
    jobs: Jobs,
    operator: OperatorProcess,
    azurite: Azurite,  # noqa: F811
    blob: BlobServiceClient,
    api_client: client.ApiClient,
    tmp_path: Path,
    container_name: str,  # noqa: F811
) -> None:
    blob.create_container(container_name)
    key_secret(jobs, azurite)
    spec = storage_spec(
        azurite,
        stage_annotations={"sim.dtjob.io/run-duration": "20s"},
        launcher_annotations={"sim.dtjob.io/run-duration": "15s"},
        output=container_name,
    )
    created = jobs.create("staged", **spec)
    uid = created["metadata"]["uid"]

    # Staging: the SAS Secrets exist before the staging pod, which is the only child so far.
    pod = wait_for(lambda: stager_pod(jobs, "staged"), timeout=60, what="the staging pod")
    assert jobs.status("staged")["phase"] == "Staging"
    assert not jobs.pods("staged", "worker")
    sas_in = secret_files(jobs, "staged-sas-in")
    assert sas_in is not None and sas_in["container-url"] == f"{azurite.endpoint}/datasets"
    assert "sp=rl" in sas_in["sas-token"]  # read + list only
    assert pod.metadata.annotations["sim.dtjob.io/run-duration"] == "20s"
    mounted = {v.secret.secret_name for v in pod.spec.volumes if v.secret}
    assert mounted == {"staged-sas-in"}

    # The stager's progress line (what its log shows) surfaces in status.staging.
    snapshot = ProgressSnapshot("transferring", 1000, 250, 50, 2**30, 2**28, 0, 12.0, 2.0e7)
    log = tmp_path / "stager.log"
    append_log(log, "listing imagenet/", PROGRESS_MARKER + snapshot.to_json())
    serve_pod_log(api_client, jobs.ns, str(pod.metadata.name), "stager", log)

    def progress() -> dict[str, Any] | None:
        staging: dict[str, Any] = jobs.status("staged").get("staging") or {}
        return staging if staging.get("filesTotal") == 1000 else None

    shown = wait_for(progress, timeout=60, what="staging progress in status")
    assert shown["filesCompleted"] == 300 and shown["bytesPerSecond"] == 20000000
    assert "300/1000 files" in jobs.status("staged")["message"]

    # Staged -> workers: rank 0 (worker 0) mounts the output SAS; the launcher uploads results after training.
    wait_for(lambda: len(jobs.pods("staged", "worker")) == 2, timeout=90, what="workers after staging")
    staged = jobs.condition("staged", "Staged")
    assert staged and staged["status"] == "True"
    worker0 = jobs.core.read_namespaced_pod("staged-worker-0", jobs.ns)
    assert "staged-sas-out" in {v.secret.secret_name for v in worker0.spec.volumes if v.secret}
    worker1 = jobs.core.read_namespaced_pod("staged-worker-1", jobs.ns)
    assert "staged-sas-out" not in {v.secret.secret_name for v in worker1.spec.volumes if v.secret}
    logs = {}
    for name in ("staged-worker-0", "staged-worker-1"):
        logs[name] = tmp_path / f"{name}.log"
        append_log(logs[name], f"{name}: sshd listening on port 22")
        serve_pod_log(api_client, jobs.ns, name, "worker", logs[name])
    launcher_pod = wait_for(
        lambda: next(iter(jobs.pods("staged", "launcher")), None), timeout=90, what="the launcher pod"
    )
    script = launcher_pod.spec.containers[0].command[2]
    assert f"--prefix runs/{jobs.ns}/staged/{uid}/" in script
    # Training first, keeping its exit code; the upload after, with its own retry and reserved exit code.
    assert script.index("horovodrun") < script.index("|| exit $?") < script.index("dtjob.stager upload")
    assert script.rstrip().endswith(f"|| exit {UPLOAD_FAILED_EXIT}") and "--retry-for 600" in script
    launcher_log = tmp_path / "launcher.log"
    append_log(launcher_log, "epoch 1 step 10 loss 6.9", "training done")
    serve_pod_log(api_client, jobs.ns, str(launcher_pod.metadata.name), "launcher", launcher_log)

    status = jobs.wait_phase("staged", "Succeeded", "Failed", timeout=120)
    assert status["phase"] == "Succeeded", status
    run_url = f"{azurite.endpoint}/{container_name}/runs/{jobs.ns}/staged/{uid}/"

    def logs_done() -> dict[str, Any] | None:
        output: dict[str, Any] = jobs.status("staged").get("output") or {}
        return output if output.get("logsUploaded") else None

    output = wait_for(logs_done, timeout=60, what="logs uploaded")
    assert output["url"] == run_url
    results = blob.get_container_client(container_name)
    prefix = f"runs/{jobs.ns}/staged/{uid}/logs/"
    uploaded = {b.name.removeprefix(prefix): b.name for b in results.list_blobs(name_starts_with=prefix)}
    expected = {"staged-worker-0.log", "staged-worker-1.log", f"{launcher_pod.metadata.name}.log"}
    assert expected <= set(uploaded), uploaded
    text = results.download_blob(uploaded[f"{launcher_pod.metadata.name}.log"]).readall().decode()
    assert "training done" in text
    # Workers were deleted (cleanPodPolicy Running) only after their logs were uploaded, and the SAS revoked.
    wait_for(lambda: not jobs.live_workers("staged"), timeout=60, what="workers cleaned up")
    wait_for(
        lambda: secret_files(jobs, "staged-sas-in") is None and secret_files(jobs, "staged-sas-out") is None,
        timeout=60,
        what="SAS Secrets deleted",
    )
    reasons = [e.reason for e in jobs.events("staged")]
    assert {"Staging", "Staged", "LogsUploaded", "LauncherSucceeded"} <= set(reasons), reasons
    assert_no_secrets_leaked(jobs, api_client, "staged", operator, azurite.account_key)


def test_failed_staging_fails_the_job_with_the_stagers_reason(
    jobs: Jobs,
    operator: OperatorProcess,
    azurite: Azurite,  # noqa: F811
    api_client: client.ApiClient,
) -> None:
    key_secret(jobs, azurite)
    spec = storage_spec(azurite, {"sim.dtjob.io/outcome": "Failed"}, {}, output=None)
    jobs.create("badstage", **spec)
    status = jobs.wait_phase("badstage", "Failed", "Succeeded", timeout=150)
    failed = jobs.condition("badstage", "Failed")
    assert failed and failed["reason"] == "StagingFailed", status
    assert "staging Job badstage-stage failed" in failed["message"]
    assert "exited with status 1" in failed["message"]
    assert status["staging"]["phase"] == "failed"
    staged = jobs.condition("badstage", "Staged")
    assert staged and staged["status"] == "False"
    assert not jobs.pods("badstage", "worker") and jobs.launcher("badstage") is None
    wait_for(lambda: secret_files(jobs, "badstage-sas-in") is None, timeout=60, what="SAS Secret deleted")
    assert_no_secrets_leaked(jobs, api_client, "badstage", operator, azurite.account_key)


def test_stagers_own_reason_reaches_the_failed_condition(
    jobs: Jobs,
    operator: OperatorProcess,
    azurite: Azurite,  # noqa: F811
) -> None:
    key_secret(jobs, azurite)
    # What the stager writes to its termination log when the input SAS is refused.
    reason = "input SAS denied (403): check Secret denied-sas-in"
    final = ProgressSnapshot("failed", 0, 0, 0, 0, 0, 0, 0.4, 0.0, reason=reason)
    cues = {"sim.dtjob.io/outcome": "Failed", "sim.dtjob.io/termination-message": final.to_json()}
    jobs.create("denied", **storage_spec(azurite, cues, {}, output=None))
    status = jobs.wait_phase("denied", "Failed", "Succeeded", timeout=150)
    failed = jobs.condition("denied", "Failed")
    assert failed and failed["reason"] == "StagingFailed", status
    assert reason in failed["message"]
    assert status["staging"]["reason"] == reason
    assert not jobs.pods("denied", "worker")


def test_missing_key_secret_waits_naming_the_field_then_proceeds(
    jobs: Jobs,
    operator: OperatorProcess,
    azurite: Azurite,  # noqa: F811
) -> None:
    jobs.create("nokey", **storage_spec(azurite, {"sim.dtjob.io/run-duration": "600s"}, {}, output=None))
    status = jobs.wait_phase("nokey", "Pending", timeout=60)
    created = jobs.condition("nokey", "Created")
    assert created and created["reason"] == "StorageCredentialsNotFound", status
    assert created["message"].startswith("spec.dataset.stageFrom.credentials.secretRef: Secret 'storage-key'")
    assert secret_files(jobs, "nokey-sas-in") is None and stager_pod(jobs, "nokey") is None
    key_secret(jobs, azurite)
    jobs.wait_phase("nokey", "Staging", timeout=60)  # rechecked every 15 s while waiting
    # The status records intent first; the SAS is minted by the same reconcile right after.
    wait_for(lambda: secret_files(jobs, "nokey-sas-in") is not None, timeout=30, what="nokey-sas-in minted")


def test_a_malformed_account_key_waits_naming_the_secret_then_proceeds_once_fixed(
    jobs: Jobs,
    operator: OperatorProcess,
    azurite: Azurite,  # noqa: F811
) -> None:
    """A key that is not base64 used to raise out of every reconcile: the job retried forever with no
    status. Now it waits with a condition naming the Secret and its key, never their value."""
    labels = {STORAGE_KEY_LABEL: "true"}
    malformed = "not base64!!"
    secret = client.V1Secret(
        metadata=client.V1ObjectMeta(name=KEY_SECRET, labels=labels),
        string_data={"azurestorageaccountkey": malformed},
    )
    jobs.core.create_namespaced_secret(jobs.ns, secret)
    jobs.create("badkey", **storage_spec(azurite, {"sim.dtjob.io/run-duration": "600s"}, {}, output=None))
    status = jobs.wait_phase("badkey", "Pending", timeout=60)
    created = jobs.condition("badkey", "Created")
    assert created and created["reason"] == "StorageCredentialsInvalid", status
    assert created["message"].startswith(
        "spec.dataset.stageFrom.credentials.secretRef.key: key 'azurestorageaccountkey' of Secret "
        f"'{KEY_SECRET}' is not a base64 storage account key"
    )
    assert malformed not in created["message"]
    assert secret_files(jobs, "badkey-sas-in") is None and stager_pod(jobs, "badkey") is None
    fixed = {"stringData": {"azurestorageaccountkey": azurite.account_key}}
    jobs.core.patch_namespaced_secret(KEY_SECRET, jobs.ns, fixed)
    jobs.wait_phase("badkey", "Staging", timeout=60)  # rechecked every 15 s while waiting
    wait_for(lambda: secret_files(jobs, "badkey-sas-in") is not None, timeout=30, what="badkey-sas-in minted")
    log = operator.log_path.read_text(errors="replace")
    assert "binascii" not in log and "padding" not in log, "a malformed key must not raise out of a reconcile"


def test_key_secret_without_the_opt_in_label_waits_naming_the_field_then_proceeds(
    jobs: Jobs,
    operator: OperatorProcess,
    azurite: Azurite,  # noqa: F811
) -> None:
    key_secret(jobs, azurite, opt_in=False)
    jobs.create("optin", **storage_spec(azurite, {"sim.dtjob.io/run-duration": "600s"}, {}, output=None))
    status = jobs.wait_phase("optin", "Pending", timeout=60)
    created = jobs.condition("optin", "Created")
    assert created and created["reason"] == "StorageCredentialsNotAllowed", status
    field = "spec.dataset.stageFrom.credentials.secretRef"
    expected = f"{field}: Secret 'storage-key' is not labelled {STORAGE_KEY_LABEL}=true"
    assert created["message"].startswith(expected)
    assert secret_files(jobs, "optin-sas-in") is None and stager_pod(jobs, "optin") is None
    opt_in = {"metadata": {"labels": {STORAGE_KEY_LABEL: "true"}}}
    jobs.core.patch_namespaced_secret(KEY_SECRET, jobs.ns, opt_in)
    jobs.wait_phase("optin", "Staging", timeout=60)
    # The status records intent first; the SAS is minted by the same reconcile right after.
    wait_for(lambda: secret_files(jobs, "optin-sas-in") is not None, timeout=30, what="optin-sas-in minted")


def test_storage_the_namespace_may_not_use_fails_the_job_before_anything_is_signed(
    jobs: Jobs,
    operator: OperatorProcess,
    azurite: Azurite,  # noqa: F811
    container_name: str,  # noqa: F811
) -> None:
    key_secret(jobs, azurite)
    # The cluster-wide settings allow Azurite's account; this namespace may read one container of it (the
    # annotation's former name) and write another.
    annotations = {ANNOTATION_CONTAINERS: "datasets", ANNOTATION_WRITE_CONTAINERS: "team-runs",
                   ANNOTATION_CLIENT_IDS: ""}  # fmt: skip
    jobs.core.patch_namespace(jobs.ns, {"metadata": {"annotations": annotations}})
    jobs.create("foreign", **storage_spec(azurite, {}, {}, output=container_name))
    status = jobs.wait_phase("foreign", "Failed", "Succeeded", timeout=60)
    failed = jobs.condition("foreign", "Failed")
    assert failed and failed["reason"] == "StorageNotAllowed", status
    assert failed["message"] == (
        f"spec.output.container: container {container_name!r} is not writable in namespace {jobs.ns} "
        f"(allowed: team-runs (annotation {ANNOTATION_WRITE_CONTAINERS} on Namespace {jobs.ns}))"
    )
    # A client ID of the installer's choosing only: refused before the operator asks Azure for anything.
    identity = {"authMode": "workloadIdentity", "clientId": "0b7f7c3e-1d2a-4c5b-9e8f-123456789abc"}
    spec = storage_spec(azurite, {}, {}, output=None)
    spec["dataset"]["stageFrom"]["credentials"] = identity
    jobs.create("borrowed", **spec)
    jobs.wait_phase("borrowed", "Failed", "Succeeded", timeout=60)
    refused = jobs.condition("borrowed", "Failed")
    assert refused and refused["reason"] == "StorageNotAllowed"
    assert refused["message"].startswith("spec.dataset.stageFrom.credentials.clientId: client ID 0b7f7c3e-")


def test_a_namespace_that_reads_a_shared_dataset_may_not_write_its_results_there(
    jobs: Jobs,
    operator: OperatorProcess,
    azurite: Azurite,  # noqa: F811
) -> None:
    """Reading is not writing: a team allowed to stage from the shared `datasets` container cannot point its
    output there (its rank 0 would hold a token that overwrites everyone's training data)."""
    key_secret(jobs, azurite)
    # The cluster-wide write list is `*` here; the namespace reads `datasets`, which `*` never makes writable.
    jobs.core.patch_namespace(
        jobs.ns, {"metadata": {"annotations": {ANNOTATION_READ_CONTAINERS: "datasets"}}}
    )
    jobs.create("poison", **storage_spec(azurite, {}, {}, output="datasets"))
    status = jobs.wait_phase("poison", "Failed", "Succeeded", timeout=60)
    failed = jobs.condition("poison", "Failed")
    assert failed and failed["reason"] == "StorageNotAllowed", status
    assert failed["message"].startswith(
        "spec.output.container: container 'datasets' is read by jobs "
        f"(annotation {ANNOTATION_READ_CONTAINERS} on Namespace {jobs.ns} names it)"
    )
    assert secret_files(jobs, "poison-sas-in") is None and secret_files(jobs, "poison-sas-out") is None
    assert stager_pod(jobs, "poison") is None
    # A namespace whose write list is empty writes nowhere, whatever it reads.
    closed = {ANNOTATION_READ_CONTAINERS: "*", ANNOTATION_WRITE_CONTAINERS: ""}
    jobs.core.patch_namespace(jobs.ns, {"metadata": {"annotations": closed}})
    jobs.create("nowhere", **storage_spec(azurite, {}, {}, output="results"))
    jobs.wait_phase("nowhere", "Failed", "Succeeded", timeout=60)
    refused = jobs.condition("nowhere", "Failed")
    assert refused and refused["reason"] == "StorageNotAllowed"
    assert refused["message"] == (
        f"spec.output.container: container 'results' is not writable in namespace {jobs.ns} "
        f"(allowed: none (annotation {ANNOTATION_WRITE_CONTAINERS} on Namespace {jobs.ns}))"
    )
    assert secret_files(jobs, "nowhere-sas-in") is None and secret_files(jobs, "nowhere-sas-out") is None
    for job in ("foreign", "borrowed"):
        assert secret_files(jobs, f"{job}-sas-in") is None and secret_files(jobs, f"{job}-sas-out") is None
        assert not jobs.pods(job) and stager_pod(jobs, job) is None and jobs.launcher(job) is None
    assert "user delegation key" not in operator.log_path.read_text(errors="replace")


def test_sas_is_rotated_before_it_expires(
    jobs: Jobs,
    operator: OperatorProcess,
    azurite: Azurite,  # noqa: F811
    blob: BlobServiceClient,
    container_name: str,  # noqa: F811
) -> None:
    blob.create_container(container_name)
    key_secret(jobs, azurite)
    spec = storage_spec(azurite, {}, {"sim.dtjob.io/run-duration": "600s"}, output=container_name)
    jobs.create("rotate", **spec)
    first = wait_for(lambda: secret_files(jobs, "rotate-sas-out"), timeout=60, what="the output SAS Secret")
    meta = jobs.core.read_namespaced_secret("rotate-sas-out", jobs.ns).metadata
    issued = parse_time(meta.annotations[ANNOTATION_ISSUED])
    expires = parse_time(meta.annotations[ANNOTATION_EXPIRES])
    assert 0 < (expires - issued).total_seconds() <= LIFETIME_S

    def rotated() -> dict[str, str] | None:
        files = secret_files(jobs, "rotate-sas-out")
        return files if files and files["sas-token"] != first["sas-token"] else None

    second = wait_for(rotated, timeout=90, what="the output SAS rotated")
    assert datetime.now(UTC) < expires, "rotated only after the old token expired"
    assert parse_time(second["expires-at"]) > expires
    meta2 = jobs.core.read_namespaced_secret("rotate-sas-out", jobs.ns).metadata
    assert meta2.uid == meta.uid  # replaced in place: mounted copies follow
    # The new token works against the service: rank 0 can write with it.
    from azure.storage.blob import ContainerClient

    writer = ContainerClient.from_container_url(second["container-url"], credential=second["sas-token"])
    writer.upload_blob("probe.txt", b"ok", overwrite=True)
    assert blob.get_container_client(container_name).download_blob("probe.txt").readall() == b"ok"
    jobs.delete("rotate")


def test_a_failed_worlds_logs_are_kept_before_the_restart_deletes_it(
    jobs: Jobs,
    operator: OperatorProcess,
    azurite: Azurite,  # noqa: F811
    blob: BlobServiceClient,
    api_client: client.ApiClient,
    tmp_path: Path,
    container_name: str,  # noqa: F811
) -> None:
    created = running_job_with_output(jobs, azurite, blob, container_name, "crashy")
    uid = created["metadata"]["uid"]
    log = tmp_path / "worker-1.log"
    append_log(log, "rank 4: CUDA error: an illegal memory access was encountered")
    serve_pod_log(api_client, jobs.ns, "crashy-worker-1", "worker", log)
    jobs.wait_phase("crashy", "Running", timeout=90)

    jobs.annotate_pod("crashy-worker-1", {"sim.dtjob.io/outcome": "Failed"})
    wait_for(lambda: jobs.status("crashy").get("restarts") == 1, timeout=90, what="a world restart")
    name = f"runs/{jobs.ns}/crashy/{uid}/logs/attempt-0/crashy-worker-1.log"
    results = blob.get_container_client(container_name)
    kept = wait_for(
        lambda: next((b.name for b in results.list_blobs(name_starts_with=name)), None),
        timeout=60,
        what="the failed worker's log in storage",
    )
    assert "illegal memory access" in results.download_blob(kept).readall().decode()
    # The restart went on; the final upload (logs/<pod>.log) is still to come at the end.
    assert not (jobs.status("crashy").get("output") or {}).get("logsUploaded")
    # Recorded once every pod of the failed world is uploaded, a moment after its first blob appears.
    wait_for(
        lambda: any(e.reason == "LogsUploaded" and "attempt-0" in e.message for e in jobs.events("crashy")),
        timeout=30,
        what="the LogsUploaded event of attempt 0",
    )


def test_a_rejected_job_leaves_what_another_owner_holds_under_its_names(
    jobs: Jobs,
    operator: OperatorProcess,
    azurite: Azurite,  # noqa: F811
) -> None:
    """A job the operator rejects revokes its SAS Secrets and frees its world, by owner: before, it deleted
    `<job>-sas-in/out` and every pod labelled with its name, whoever they belonged to."""
    for name in ("keep-sas-in", "keep-sas-out"):
        secret = client.V1Secret(metadata=client.V1ObjectMeta(name=name), string_data={"token": "theirs"})
        jobs.core.create_namespaced_secret(jobs.ns, secret)
    bystander = client.V1Pod(
        metadata=client.V1ObjectMeta(name="bystander", labels={"dtjob.io/job-name": "keep"}),
        spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="busybox")]),
    )
    jobs.core.create_namespaced_pod(jobs.ns, bystander)
    spec = storage_spec(azurite, {}, {}, output=None)
    # Past the schema, refused by the operator: an emulator endpoint on a host the installer did not list.
    spec["dataset"]["stageFrom"]["endpoint"] = "http://10.9.8.7:10000/devstoreaccount1"
    jobs.create("keep", **spec)
    status = jobs.wait_phase("keep", "Failed", timeout=60)
    assert status["message"].startswith("spec.dataset.stageFrom.endpoint"), status
    wait_for(lambda: jobs.status("keep").get("sasSecretsDeleted"), timeout=30, what="the revocation recorded")
    for name in ("keep-sas-in", "keep-sas-out"):
        assert secret_files(jobs, name) == {"token": "theirs"}, f"{name} is not the job's: it must stay"
    assert jobs.core.read_namespaced_pod("bystander", jobs.ns).metadata.deletion_timestamp is None


def test_a_missing_results_container_waits_naming_the_field_then_proceeds(
    jobs: Jobs,
    operator: OperatorProcess,
    azurite: Azurite,  # noqa: F811
    blob: BlobServiceClient,
    container_name: str,  # noqa: F811
) -> None:
    """Before: a create+write token was minted for a container that does not exist, the run trained for hours,
    and the results upload failed at its end. Now the job waits before anything of the world exists."""
    key_secret(jobs, azurite)
    spec = storage_spec(azurite, {"sim.dtjob.io/run-duration": "5s"}, {"sim.dtjob.io/run-duration": "600s"},
                        output=container_name)  # fmt: skip
    jobs.create("nowhere-yet", **spec)

    def waiting() -> dict[str, str] | None:
        cond = jobs.condition("nowhere-yet", "Created")
        return cond if cond and cond["reason"] == "StorageContainerNotFound" else None

    cond = wait_for(waiting, timeout=60, what="Created=False StorageContainerNotFound")
    assert cond["message"].startswith(
        f"spec.output.container: container {container_name!r} does not exist in storage account"
    ), cond
    assert secret_files(jobs, "nowhere-yet-sas-out") is None and not jobs.pods("nowhere-yet")
    blob.create_container(container_name)
    wait_for(lambda: secret_files(jobs, "nowhere-yet-sas-out") is not None, timeout=60,
             what="nowhere-yet-sas-out minted once the container exists")  # fmt: skip


def test_a_sas_secret_whose_url_was_changed_is_minted_again_never_followed(
    jobs: Jobs,
    operator: OperatorProcess,
    azurite: Azurite,  # noqa: F811
    blob: BlobServiceClient,
    container_name: str,  # noqa: F811
) -> None:
    """A namespace editor rewrites `<job>-sas-out`'s container URL and keeps the annotations, so nothing is
    due to rotate. Before: the operator kept it (and used it for its own log upload); now it replaces the
    Secret with a fresh token for the spec's URL, and says so."""
    key_secret(jobs, azurite)
    blob.create_container(container_name)
    spec = storage_spec(azurite, {"sim.dtjob.io/run-duration": "5s"}, {"sim.dtjob.io/run-duration": "600s"},
                        output=container_name)  # fmt: skip
    jobs.create("edited", **spec)
    expected = f"{azurite.endpoint}/{container_name}"
    wait_for(lambda: (secret_files(jobs, "edited-sas-out") or {}).get("container-url") == expected,
             timeout=60, what="edited-sas-out minted")  # fmt: skip
    evil = base64.b64encode(b"https://attacker.example.net/loot").decode()
    jobs.core.patch_namespaced_secret("edited-sas-out", jobs.ns, {"data": {"container-url": evil}})
    restored = wait_for(
        lambda: (
            (files := secret_files(jobs, "edited-sas-out")) and files["container-url"] == expected and files
        ),
        timeout=90,  # the next reconcile: at the latest the resync
        what="the spec's URL back in edited-sas-out",
    )
    assert "sig=" in restored["sas-token"]
    assert any(
        e.reason == "SasSecretAltered" and "attacker.example.net" in e.message for e in jobs.events("edited")
    )


def test_a_stager_pod_refused_by_pod_security_fails_the_job_at_once_naming_the_volume(
    jobs: Jobs,
    operator: OperatorProcess,
    azurite: Azurite,  # noqa: F811
) -> None:
    """The staging Job's pod mounts the inline NFS share, which the `restricted` level forbids: admission
    refuses the pod, not the Job. Before: the job sat in Staging for ever."""
    key_secret(jobs, azurite)
    labels = {"pod-security.kubernetes.io/enforce": "restricted"}
    jobs.core.patch_namespace(jobs.ns, {"metadata": {"labels": labels}})
    jobs.create("nfsstage", **storage_spec(azurite, {}, {}, output=None))
    status = jobs.wait_phase("nfsstage", "Failed", "Succeeded", timeout=120)
    failed = jobs.condition("nfsstage", "Failed")
    assert failed and failed["reason"] == "PodRefused", status
    assert failed["message"].startswith(
        "spec.dataset.volume.nfs: the stager's pod (Job nfsstage-stage) is refused by Pod Security "
    ), failed["message"]
    assert not jobs.pods("nfsstage", "worker"), "no world for a job whose data cannot be staged"


def test_every_pods_log_is_uploaded_when_the_deadline_ends_the_job(
    jobs: Jobs,
    operator: OperatorProcess,
    azurite: Azurite,  # noqa: F811
    blob: BlobServiceClient,
    api_client: client.ApiClient,
    tmp_path: Path,
    container_name: str,  # noqa: F811
) -> None:
    """The pods' output SAS expires at activeDeadlineSeconds; the operator's final log upload gets through."""
    created = running_job_with_output(
        jobs, azurite, blob, container_name, "late",
        runPolicy={"activeDeadlineSeconds": 20, "cleanPodPolicy": "Running"},
    )  # fmt: skip
    uid = created["metadata"]["uid"]
    launcher_pod = launcher_pod_of(jobs, "late")
    served = {
        str(launcher_pod.metadata.name): "launcher",
        "late-worker-0": "worker",
        "late-worker-1": "worker",
    }
    for pod, container in served.items():
        path = tmp_path / f"{pod}.log"
        append_log(path, f"{pod}: epoch 3 step 41 loss 2.7")
        serve_pod_log(api_client, jobs.ns, pod, container, path)
    status = jobs.wait_phase("late", "Succeeded", "Failed", timeout=120)
    failed = jobs.condition("late", "Failed")
    assert status["phase"] == "Failed" and failed and failed["reason"] == "DeadlineExceeded", status

    def logs_done() -> dict[str, Any] | None:
        output: dict[str, Any] = jobs.status("late").get("output") or {}
        return output if output.get("logsUploaded") else None

    wait_for(logs_done, timeout=90, what="logs uploaded after the deadline")
    results = blob.get_container_client(container_name)
    prefix = f"runs/{jobs.ns}/late/{uid}/logs/"
    uploaded = {b.name.removeprefix(prefix) for b in results.list_blobs(name_starts_with=prefix)}
    assert {f"{pod}.log" for pod in served} <= uploaded, uploaded
    for pod in served:
        text = results.download_blob(f"{prefix}{pod}.log").readall().decode()
        assert f"{pod}: epoch 3 step 41" in text
    assert_no_secrets_leaked(jobs, api_client, "late", operator, azurite.account_key)


def test_results_storage_refused_for_good_fail_the_job_once_and_keep_worker_0(
    jobs: Jobs,
    operator: OperatorProcess,
    azurite: Azurite,  # noqa: F811
    blob: BlobServiceClient,
    api_client: client.ApiClient,
    tmp_path: Path,
    container_name: str,  # noqa: F811
) -> None:
    """Training succeeded, then storage refused the results upload past spec.output.uploadRetrySeconds: the
    launcher exits with the reserved code after the upload's own `failed` line. The job fails as an
    infrastructure failure (never a restart that trains again, never the user's code), and worker 0, which
    holds the results, is kept although cleanPodPolicy Running deletes the others."""
    running_job_with_output(
        jobs, azurite, blob, container_name, "unsaved", output={"uploadRetrySeconds": 60},
        runPolicy={"backoffLimit": 3, "cleanPodPolicy": "Running"},
    )  # fmt: skip
    launcher_pod = launcher_pod_of(jobs, "unsaved")
    launcher = str(launcher_pod.metadata.name)
    path = tmp_path / "launcher.log"
    append_log(
        path,
        "epoch 1 step 2 loss 6.1",
        "dtjob results upload: started",
        "dtjob results upload: retrying in 2 s (try 1 failed, 60 s of retries left): output container "
        f"{container_name}: storage error (503): storage is down",
        "dtjob results upload: failed after 6 tries in 61 s: output container "
        f"{container_name}: storage error (503): storage is down",
    )
    serve_pod_log(api_client, jobs.ns, launcher, "launcher", path)
    jobs.wait_phase("unsaved", "Running", timeout=90)
    jobs.annotate_pod(launcher, {"sim.dtjob.io/outcome": "Failed", "sim.dtjob.io/exit-code": "200"})

    status = jobs.wait_phase("unsaved", "Succeeded", "Failed", timeout=120)
    failed = jobs.condition("unsaved", "Failed")
    assert failed and failed["reason"] == "ResultsUploadFailed", status
    assert "kept on pod unsaved-worker-0" in failed["message"], failed
    assert status.get("restarts", 0) == 0, "the upload failed after training: no world restart"
    results = (status.get("output") or {}).get("results") or {}
    assert results.get("state") == "Failed" and "503" in results.get("message", ""), status
    assert results.get("keptOnPod") == "unsaved-worker-0", status
    # cleanPodPolicy Running frees worker 1's GPUs; worker 0 holds the results and stays.

    def live() -> list[str]:
        return sorted(str(p.metadata.name) for p in jobs.live_workers("unsaved"))

    wait_for(lambda: live() == ["unsaved-worker-0"], timeout=60, what="worker 1 deleted, worker 0 kept")
    time.sleep(5)  # cleanup has run (the SAS Secrets go last): worker 0 is still there
    assert live() == ["unsaved-worker-0"]
    reasons = {e.reason for e in jobs.events("unsaved")}
    assert "ResultsUploadFailed" in reasons and "Restarting" not in reasons, reasons


def test_an_elastic_world_keeps_the_pod_its_upload_ran_on_not_worker_0(
    jobs: Jobs,
    operator: OperatorProcess,
    azurite: Azurite,  # noqa: F811
    blob: BlobServiceClient,
    api_client: client.ApiClient,
    tmp_path: Path,
    container_name: str,  # noqa: F811
) -> None:
    """Worker 0 of an elastic world was lost and replaced while training went on, so rank 0 (and the
    results) moved to worker 1, where the launcher's upload ran and failed for good. Before: the operator kept
    worker 0, the fresh replacement holding nothing, and cleanPodPolicy deleted worker 1 with the model."""
    running_job_with_output(
        jobs, azurite, blob, container_name, "moved", output={"uploadRetrySeconds": 60},
        elastic={"minWorkers": 1, "maxWorkers": 2}, runPolicy={"cleanPodPolicy": "Running"},
    )  # fmt: skip
    first = {str(p.metadata.name): str(p.metadata.uid) for p in jobs.live_workers("moved")}
    jobs.core.delete_namespaced_pod("moved-worker-0", jobs.ns, grace_period_seconds=0)

    def replaced() -> dict[str, str] | None:
        now = {str(p.metadata.name): str(p.metadata.uid) for p in jobs.live_workers("moved")}
        return now if now.get("moved-worker-0") not in (None, first["moved-worker-0"]) else None

    uids = wait_for(replaced, timeout=90, what="worker 0 replaced")
    launcher = str(launcher_pod_of(jobs, "moved").metadata.name)
    path = tmp_path / "launcher.log"
    refused = f"output container {container_name}: storage error (503): storage is down"
    append_log(path, results_upload.started_line("moved-worker-1"),
               results_upload.failed_line(6, 61, refused, "moved-worker-1"))  # fmt: skip
    serve_pod_log(api_client, jobs.ns, launcher, "launcher", path)
    jobs.annotate_pod(launcher, {"sim.dtjob.io/outcome": "Failed", "sim.dtjob.io/exit-code": "200"})

    status = jobs.wait_phase("moved", "Succeeded", "Failed", timeout=120)
    failed = jobs.condition("moved", "Failed")
    assert failed and failed["reason"] == "ResultsUploadFailed", status
    assert "kept on pod moved-worker-1" in failed["message"], failed
    results = status["output"]["results"]
    assert (results["keptOnPod"], results["keptOnPodUID"]) == ("moved-worker-1", uids["moved-worker-1"])

    def live() -> dict[str, str]:
        return {str(p.metadata.name): str(p.metadata.uid) for p in jobs.live_workers("moved")}

    kept = {"moved-worker-1": uids["moved-worker-1"]}
    wait_for(lambda: live() == kept, timeout=60, what="worker 0's replacement deleted, worker 1 kept")
    time.sleep(5)  # cleanup has run (the SAS Secrets go last): worker 1 is still there
    assert live() == kept
