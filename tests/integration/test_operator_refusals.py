"""Refusals from the real API server become a clear status, never a crash loop or a silent retry.

- Pod Security admission (403): the namespace enforces `restricted`, which forbids the inline NFS volume the
  job asks for, or the root the launcher's template asks for. The job fails naming the field; no pod is left.
- A ResourceQuota (403), on pods or on the job's SAS Secrets: the job waits in Pending with condition
  Created=False quoting the quota, and goes on by itself once the quota allows it (or fails once refused for
  runPolicy.startupDeadlineSeconds, freeing the workers).
- A node selector the API server cannot parse (400 to the node list): a Failed job naming the field, where the
  reconcile used to raise on every attempt. The CRD refuses such pools and labels at apply now, so this drives
  the operator's own check with a spec the parser never produced (an older CRD, or the operator's config).
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest
from azure.core.exceptions import ResourceExistsError
from azure.storage.blob import BlobServiceClient
from dtjob.kube.client import KubeClient
from dtjob.kube.connect import ApiClient
from dtjob.names import STORAGE_KEY_LABEL
from dtjob.reconcile.preflight import preflight
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from testbed.azurite import DEV_ACCOUNT_NAME, Azurite
from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess
from tests.azure.conftest import azurite  # noqa: F401  (fixture: a running Azurite)
from tests.unit.operator_fixtures import job_spec

pytestmark = pytest.mark.integration

NFS_DATA = {
    "source": "imagenet",
    "volume": {"nfs": {"server": "files.example.net", "path": "/datasets"}, "mountPath": "/data"},
}


def test_pod_security_refusal_fails_the_job_naming_the_field(
    jobs: Jobs, operator: OperatorProcess, core_v1: client.CoreV1Api, namespace: str
) -> None:
    core_v1.patch_namespace(
        namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    )
    jobs.create("nfsdata", dataset=NFS_DATA)
    status = jobs.wait_phase("nfsdata", "Failed", timeout=60)
    assert status["message"].startswith("spec.dataset.volume.nfs: Pod nfsdata-worker-"), status["message"]
    assert "violates PodSecurity" in status["message"] and "persistentVolumeClaim" in status["message"]
    cond = jobs.condition("nfsdata", "Failed")
    assert cond and cond["reason"] == "PodSecurityViolation"
    jobs.wait_event("nfsdata", "PodSecurityViolation")  # posted after the status patch just read
    wait_for(lambda: not jobs.pods("nfsdata"), timeout=30, what="no pods left behind")
    assert jobs.launcher("nfsdata") is None


def test_quota_refusal_waits_with_the_cause_and_goes_on_once_it_fits(
    jobs: Jobs, operator: OperatorProcess, core_v1: client.CoreV1Api, namespace: str
) -> None:
    quota = client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="pods"), spec=client.V1ResourceQuotaSpec(hard={"pods": "1"})
    )
    core_v1.create_namespaced_resource_quota(namespace, quota)
    # Admission refuses every pod until the quota controller has written the quota's status.
    wait_for(
        lambda: (core_v1.read_namespaced_resource_quota("pods", namespace).status.hard or {}).get("pods"),
        timeout=30,
        what="quota status",
    )
    jobs.create("quota")

    def refused() -> dict[str, str] | None:
        cond = jobs.condition("quota", "Created")
        return cond if cond and cond["reason"] == "CreateForbidden" else None

    cond = wait_for(refused, timeout=60, what="Created=False CreateForbidden")
    assert cond["status"] == "False" and "exceeded quota: pods" in cond["message"]
    status = jobs.status("quota")
    assert status["phase"] == "Pending" and "exceeded quota" in status["message"]
    assert "creating" not in status["message"]
    assert len(jobs.pods("quota")) == 1  # worker 0 fitted; the job keeps it while it waits for room
    jobs.wait_event("quota", "CreateForbidden")  # posted after the status patch just read

    # Room for the world: the next retry creates worker 1 and the launcher pod (under the same quota), which
    # is released once both workers are Ready.
    core_v1.patch_namespaced_resource_quota("pods", namespace, {"spec": {"hard": {"pods": "10"}}})
    status = jobs.wait_phase("quota", "Starting", "Running", "Succeeded", timeout=120)
    assert jobs.launcher("quota") is not None
    assert jobs.condition("quota", "Created")["status"] == "True"
    assert "exceeded quota" not in status["message"]


def test_a_node_selector_the_api_server_refuses_fails_the_job_naming_the_field(
    operator_api: ApiClient, simulated_pool: object
) -> None:
    spec = job_spec()
    bad = replace(
        spec, placement=replace(spec.placement, node_selector={"kubernetes.azure.com/agentpool": "GPU pool"})
    )
    blocker = preflight(KubeClient(operator_api), bad)  # raised ApiException(400) in every reconcile before
    assert blocker is not None and blocker.fatal and blocker.reason == "InvalidNodeSelector"
    assert blocker.message.startswith("spec.placement.nodePool / spec.placement.nodeSelector:")
    assert "GPU pool" in blocker.message
    assert preflight(KubeClient(operator_api), spec) is None  # the pool as the operator builds it is fine


@pytest.fixture
def operator_env() -> dict[str, str]:
    return {"DTJOB_ALLOWED_STORAGE_ACCOUNTS": DEV_ACCOUNT_NAME, "DTJOB_WRITE_CONTAINERS": "*"}


@pytest.mark.azure
def test_a_sas_secret_refused_by_a_quota_waits_with_the_cause(
    jobs: Jobs,
    operator: OperatorProcess,
    core_v1: client.CoreV1Api,
    namespace: str,
    azurite: Azurite,  # noqa: F811
) -> None:
    # The SAS Secrets come first, before anything that mounts them: a quota on Secrets refuses them there.
    secret = client.V1Secret(
        metadata=client.V1ObjectMeta(name="storage-key", labels={STORAGE_KEY_LABEL: "true"}),
        string_data={"azurestorageaccountkey": azurite.account_key},
    )
    core_v1.create_namespaced_secret(namespace, secret)
    quota = client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="secrets"), spec=client.V1ResourceQuotaSpec(hard={"secrets": "1"})
    )
    core_v1.create_namespaced_resource_quota(namespace, quota)
    wait_for(
        lambda: (
            (core_v1.read_namespaced_resource_quota("secrets", namespace).status.used or {}).get("secrets")
            == "1"
        ),
        timeout=30,
        what="quota status counting the key Secret",
    )
    credentials = {"authMode": "accountKey", "secretRef": {"name": "storage-key"}}
    with contextlib.suppress(ResourceExistsError):  # the results container a real setup has
        BlobServiceClient(azurite.endpoint, credential=azurite.account_key).create_container("results")
    jobs.create(
        "sasquota", output={"endpoint": azurite.endpoint, "container": "results", "credentials": credentials}
    )

    def refused() -> dict[str, str] | None:
        cond = jobs.condition("sasquota", "Created")
        return cond if cond and cond["reason"] == "CreateForbidden" else None

    cond = wait_for(refused, timeout=60, what="Created=False CreateForbidden")
    assert (
        "Secret sasquota-sas-out refused" in cond["message"] and "exceeded quota: secrets" in cond["message"]
    )
    assert jobs.status("sasquota")["phase"] == "Pending" and not jobs.pods("sasquota")

    core_v1.patch_namespaced_resource_quota("secrets", namespace, {"spec": {"hard": {"secrets": "10"}}})
    wait_for(lambda: jobs.live_workers("sasquota"), timeout=90, what="workers, once the SAS Secret fits")
    assert core_v1.read_namespaced_secret("sasquota-sas-out", namespace) is not None


def test_a_launcher_pod_refused_by_pod_security_fails_the_job_at_once_and_frees_the_workers(
    jobs: Jobs, operator: OperatorProcess, core_v1: client.CoreV1Api, namespace: str
) -> None:
    """The workers meet `restricted`; the launcher's template asks for root. Admission refuses the launcher
    pod the operator creates: the job fails at once, naming the template, and no worker keeps its GPUs."""
    core_v1.patch_namespace(
        namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    )
    root = {"spec": {"securityContext": {"runAsUser": 0, "runAsNonRoot": False}}}
    jobs.create("rootlaunch", launcher={"template": root})
    status = jobs.wait_phase("rootlaunch", "Failed", "Succeeded", timeout=120)
    failed = jobs.condition("rootlaunch", "Failed")
    assert failed and failed["reason"] == "PodSecurityViolation", status
    assert failed["message"].startswith(
        "spec.launcher.template: Pod rootlaunch-launcher refused by the API server: "
        'pods "rootlaunch-launcher" is forbidden: violates PodSecurity '
    ), failed["message"]
    assert "runAsUser=0" in failed["message"]
    assert status["message"] == failed["message"] and status["restarts"] == 0
    jobs.wait_event("rootlaunch", "PodSecurityViolation")  # posted after the status patch just read
    wait_for(lambda: not jobs.live_workers("rootlaunch"), timeout=60, what="the workers freed")
    assert jobs.launcher("rootlaunch") is None


def test_a_launcher_pod_refused_by_a_quota_says_so_then_fails_at_the_startup_deadline(
    jobs: Jobs, operator: OperatorProcess, core_v1: client.CoreV1Api, namespace: str
) -> None:
    """The workers use up the namespace's pod quota, so the launcher pod the operator creates never fits:
    the job says why while it retries, and fails once refused for runPolicy.startupDeadlineSeconds, freeing
    the workers' GPUs."""
    quota = client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="pods"), spec=client.V1ResourceQuotaSpec(hard={"pods": "2"})
    )
    core_v1.create_namespaced_resource_quota(namespace, quota)
    wait_for(
        lambda: (core_v1.read_namespaced_resource_quota("pods", namespace).status.hard or {}).get("pods"),
        timeout=30,
        what="quota status",
    )
    jobs.create("full", runPolicy={"startupDeadlineSeconds": 60})

    def refused() -> dict[str, str] | None:
        cond = jobs.condition("full", "Created")
        return cond if cond and cond["reason"] == "CreateForbidden" else None

    cond = wait_for(refused, timeout=90, what="Created=False CreateForbidden")
    event_lists = event_lists_made(operator)
    assert cond["status"] == "False"
    assert cond["message"].startswith("Pod full-launcher refused by the API server: "), cond["message"]
    assert "exceeded quota: pods" in cond["message"]
    assert cond["message"].endswith("; retrying every 30s, at most runPolicy.startupDeadlineSeconds (60s)")
    assert jobs.status("full")["message"] == cond["message"]
    assert len(jobs.live_workers("full")) == 2 and jobs.launcher("full") is None
    jobs.wait_event("full", "CreateForbidden")  # posted after the status patch just read
    status = jobs.wait_phase("full", "Failed", "Succeeded", timeout=120)
    failed = jobs.condition("full", "Failed")
    assert failed and failed["reason"] == "StartupDeadlineExceeded", status
    assert failed["message"].startswith("Pod full-launcher refused by the API server: "), failed["message"]
    assert "exceeded quota: pods" in failed["message"]
    assert failed["message"].endswith(
        "; still refused 60s after the first refusal (runPolicy.startupDeadlineSeconds)"
    ), failed["message"]
    wait_for(lambda: not jobs.live_workers("full"), timeout=60, what="the workers freed")
    assert jobs.launcher("full") is None
    # The refusal is the create's own answer (a 403 quoting the quota), never read from Events: no LIST of
    # Events in that minute of retries.
    assert event_lists_made(operator) == event_lists


def event_lists_made(operator: OperatorProcess) -> float:
    """How many LISTs of Events the operator has made (its FailedCreate watch's own among them)."""
    samples = (
        sample
        for family in text_string_to_metric_families(operator.metrics_text())
        for sample in family.samples
    )
    labels = {"verb": "list", "resource": "events"}
    return sum(
        s.value for s in samples
        if s.name == "dtjob_kube_api_request_duration_seconds_count" and s.labels == labels
    )  # fmt: skip
