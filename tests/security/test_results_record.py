"""The record of a results upload done later (`dtjob results upload`) under attack: tenant A's editor, with
the chart's edit role only (DistributedTrainingJobs; no Secrets, no pods, no storage), writes the
`dtjob.io/results-uploaded` annotation on a job whose own upload failed for good (ResultsUploadFailed).

The record is input: the operator takes it only when it names this run (the job's UID, the attempt, the kept
pod by name and UID, as the status says) and storage, read with the operator's own credentials, holds the
run's manifest and every file it lists. Until then the job stays Failed and the pod holding the results
stays, whatever cleanPodPolicy says.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from azure.storage.blob import BlobServiceClient
from dtjob.contract import results_upload
from dtjob.contract.results_upload import ANNOTATION_UPLOADED_LATER, ResultsRecord
from dtjob.names import STORAGE_KEY_LABEL
from kubernetes import client

from testbed.azurite import DEV_ACCOUNT_NAME, Azurite
from testbed.kube_wait import wait_for
from testbed.operator_harness import GROUP, PLURAL, VERSION, Jobs, OperatorProcess
from testbed.sim_logs import append_log, serve_pod_log
from testbed.tenancy import Tenant
from tests.azure.conftest import azurite  # noqa: F401  (the fixture)

pytestmark = pytest.mark.azure

KEY_SECRET = "storage-key"
# How long a forged record is given to do harm: the operator reconciles an annotated job within a second.
HARM_WINDOW_S = 8.0
RESULTS = {"model/final.pt": b"w" * 3000, "metrics.json": b'{"top1": 0.76}'}
LEGACY_RECORD = "done: 2 files, 3014 bytes, after 1 tries (dtjob results upload, 2026-11-28T09:00:00Z)"


@pytest.fixture
def chart_sets() -> tuple[str, ...]:
    return (
        f"storagePolicy.accounts[0]={DEV_ACCOUNT_NAME}",
        "storagePolicy.writeContainers[0]=results-{namespace}",
    )


@pytest.fixture
def blob(azurite: Azurite) -> BlobServiceClient:  # noqa: F811
    return BlobServiceClient(azurite.endpoint, credential=azurite.account_key)


def failed_upload(
    api_client: client.ApiClient,
    tenant: Tenant,
    azurite: Azurite,  # noqa: F811
    blob: BlobServiceClient,
    tmp_path: Path,
    name: str,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Tenant `tenant`'s editor runs a job writing results to its namespace's own container; training
    succeeds and storage refuses the results for good (the launcher's log says so, the launcher exits 200).
    Returns the job as the admin reads it once it is Failed with ResultsUploadFailed."""
    ns = tenant.namespace
    blob.create_container(f"results-{ns}")
    secret = client.V1Secret(
        metadata=client.V1ObjectMeta(name=KEY_SECRET, labels={STORAGE_KEY_LABEL: "true"}),
        string_data={"azurestorageaccountkey": azurite.account_key},
    )
    client.CoreV1Api(api_client).create_namespaced_secret(ns, secret)  # the platform team's key
    credentials = {"authMode": "accountKey", "secretRef": {"name": KEY_SECRET}}
    output = {
        "endpoint": azurite.endpoint, "container": f"results-{ns}", "prefix": "runs",
        "uploadRetrySeconds": 60, "credentials": credentials,
    }  # fmt: skip
    spec = {
        "framework": "pytorch", "workers": 2, "gpusPerWorker": 4, "output": output,
        "runPolicy": {"cleanPodPolicy": "Running"},
        "launcher": {"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}},
    }  # fmt: skip
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "DistributedTrainingJob",
            "metadata": {"name": name, "annotations": annotations or {}}, "spec": spec}  # fmt: skip
    tenant.jobs().custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
    checked = Jobs(api_client, ns)
    wait_for(lambda: len(checked.live_workers(name)) == 2, timeout=90, what="workers")
    launcher = wait_for(lambda: next(iter(checked.pods(name, "launcher")), None), timeout=90, what="launcher")
    log = tmp_path / f"{name}-launcher.log"
    refused = f"output container results-{ns}: storage error (503): storage is down"
    append_log(log, "epoch 1 step 2 loss 6.1", results_upload.started_line(f"{name}-worker-0"),
               results_upload.failed_line(6, 61, refused, f"{name}-worker-0"))  # fmt: skip
    serve_pod_log(api_client, ns, str(launcher.metadata.name), "launcher", log)
    checked.wait_phase(name, "Running", timeout=90)
    checked.annotate_pod(str(launcher.metadata.name), {"sim.dtjob.io/outcome": "Failed",
                                                       "sim.dtjob.io/exit-code": "200"})  # fmt: skip
    checked.wait_phase(name, "Failed", "Succeeded", timeout=120)
    failed = checked.condition(name, "Failed")
    assert failed and failed["reason"] == "ResultsUploadFailed", checked.status(name)
    # cleanPodPolicy Running has freed worker 1: the kept pod is the only one left.
    wait_for(lambda: len(checked.live_workers(name)) == 1, timeout=60, what="worker 1 freed")
    return checked.get(name) or {}


def kept_pod(job: dict[str, Any]) -> tuple[str, str]:
    results = job["status"]["output"]["results"]
    return str(results["keptOnPod"]), str(results["keptOnPodUID"])


def record_for(job: dict[str, Any], **changed: Any) -> str:
    """The record `dtjob results upload` writes for `job`'s kept results; `changed`: what a forger (or a
    manifest applied again) has in it instead."""
    pod, pod_uid = kept_pod(job)
    fields: dict[str, Any] = {
        "job_uid": job["metadata"]["uid"], "attempt": job["status"]["restarts"], "pod": pod,
        "pod_uid": pod_uid, "files": len(RESULTS), "bytes": sum(len(d) for d in RESULTS.values()),
        "at": "2026-11-28T09:00:00Z",
    }  # fmt: skip
    return ResultsRecord(**{**fields, **changed}).to_annotation()


def annotate_as(tenant: Tenant, name: str, record: str) -> None:
    """As the tenant's editor: the chart's edit role patches DistributedTrainingJobs."""
    patch = {"metadata": {"annotations": {ANNOTATION_UPLOADED_LATER: record}}}
    tenant.jobs().custom.patch_namespaced_custom_object(GROUP, VERSION, tenant.namespace, PLURAL, name, patch)


def assert_still_kept(
    api_client: client.ApiClient, tenant: Tenant, name: str, pod: str, pod_uid: str
) -> None:
    """For the whole harm window: the job stays Failed, keeps naming the pod, and that very pod lives."""
    checked = Jobs(api_client, tenant.namespace)
    deadline = time.monotonic() + HARM_WINDOW_S
    while time.monotonic() < deadline:
        status = checked.status(name)
        assert status.get("phase") == "Failed", (
            f"a forged record turned the job {status.get('phase')}: {status}"
        )
        assert kept_pod({"status": status}) == (pod, pod_uid), status
        live = {str(p.metadata.name): str(p.metadata.uid) for p in checked.live_workers(name)}
        assert live.get(pod) == pod_uid, f"the pod holding the results was deleted: {live}"
        time.sleep(0.5)


def event_said(
    api_client: client.ApiClient, tenant: Tenant, name: str, reason: str
) -> Callable[[], str | None]:
    def said() -> str | None:
        events = Jobs(api_client, tenant.namespace).events(name)
        return next((str(e.message) for e in events if e.reason == reason), None)

    return said


def store_results(blob: BlobServiceClient, job: dict[str, Any]) -> None:
    """What a real `dtjob results upload` leaves under the run's prefix: the files, then the manifest."""
    meta = job["metadata"]
    container = blob.get_container_client(f"results-{meta['namespace']}")
    prefix = f"runs/{meta['namespace']}/{meta['name']}/{meta['uid']}/"
    for rel, data in RESULTS.items():
        container.upload_blob(prefix + rel, data, overwrite=True)
    manifest = results_upload.manifest_text({rel: len(data) for rel, data in RESULTS.items()})
    container.upload_blob(prefix + results_upload.MANIFEST_NAME, manifest.encode(), overwrite=True)


def test_an_editors_forged_upload_record_leaves_the_job_failed_and_its_results_pod_kept(
    operator: OperatorProcess,
    tenant_a: Tenant,
    api_client: client.ApiClient,
    azurite: Azurite,  # noqa: F811
    blob: BlobServiceClient,
    tmp_path: Path,
) -> None:
    """Before: any text in the form of the uploader's done line made the job Succeeded, and cleanPodPolicy
    deleted the pod holding the only copy of the trained model. Neither that text nor a record matching the
    status in every field does anything until storage holds the results; then the real record is taken."""
    job = failed_upload(api_client, tenant_a, azurite, blob, tmp_path, "forged")
    pod, pod_uid = kept_pod(job)
    assert pod == "forged-worker-0", job["status"]

    annotate_as(tenant_a, "forged", LEGACY_RECORD)
    assert_still_kept(api_client, tenant_a, "forged", pod, pod_uid)

    annotate_as(tenant_a, "forged", record_for(job))  # right in every field; storage holds nothing
    said = wait_for(event_said(api_client, tenant_a, "forged", "ResultsNotInStorage"), timeout=30,
                    what="the operator looking in storage")  # fmt: skip
    assert results_upload.MANIFEST_NAME in said, said
    assert_still_kept(api_client, tenant_a, "forged", pod, pod_uid)

    # The results really uploaded (as `dtjob results upload` does, files then manifest): the record is taken.
    store_results(blob, job)
    annotate_as(tenant_a, "forged", record_for(job, at="2026-11-28T09:05:00Z"))
    checked = Jobs(api_client, tenant_a.namespace)
    status = checked.wait_phase("forged", "Succeeded", timeout=30)
    succeeded = checked.condition("forged", "Succeeded")
    assert succeeded and succeeded["reason"] == "ResultsUploadedLater", status
    assert "2 files, 3014 bytes" in succeeded["message"], succeeded
    wait_for(lambda: not checked.live_workers("forged"), timeout=30, what="the kept pod freed")


def test_a_record_of_another_run_is_ignored_and_the_results_pod_kept(
    operator: OperatorProcess,
    tenant_a: Tenant,
    api_client: client.ApiClient,
    azurite: Azurite,  # noqa: F811
    blob: BlobServiceClient,
    tmp_path: Path,
) -> None:
    """A manifest applied again carries the record of an earlier job of the same name. Before: at this job's
    own upload failure the operator took it, marked the job Succeeded and deleted the pod holding the new
    results. A record for an older UID, even with this run's results in storage, changes nothing."""
    job = failed_upload(
        api_client, tenant_a, azurite, blob, tmp_path, "again", {ANNOTATION_UPLOADED_LATER: LEGACY_RECORD}
    )
    pod, pod_uid = kept_pod(job)
    assert_still_kept(api_client, tenant_a, "again", pod, pod_uid)

    store_results(blob, job)  # so that only the record's UID stands between it and Succeeded
    annotate_as(tenant_a, "again", record_for(job, job_uid=str(uuid.uuid4())))
    said = wait_for(event_said(api_client, tenant_a, "again", "ResultsRecordIgnored"), timeout=30,
                    what="the record ignored")  # fmt: skip
    assert "not this job's" in said and job["metadata"]["uid"] in said, said
    assert_still_kept(api_client, tenant_a, "again", pod, pod_uid)
