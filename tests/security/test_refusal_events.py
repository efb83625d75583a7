"""Why a staging Job's pod has not been created comes from the Job controller's FailedCreate Events, which the
operator watches in every namespace it serves (the launcher is a pod the operator creates itself, refused
with the create's own answer; only an earlier release's launcher Job is judged by its Events as well). Any
account that may post Events (many workloads' may) can write one naming any Job's uid. If it is written in
another namespace, it must say nothing about a tenant's job: a forged Pod Security refusal would fail the job
at once, before it ever trained, and give its place in the cluster's queue to the forger's jobs."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from azure.storage.blob import BlobServiceClient
from dtjob import names
from kubernetes import client, config

from testbed.azurite import DEV_ACCOUNT_NAME, Azurite
from testbed.kube_wait import wait_for
from testbed.operator_harness import GROUP, PLURAL, VERSION, Jobs, OperatorProcess
from testbed.tenancy import Tenant, TenantCluster, service_account_token, token_kubeconfig
from tests.azure.conftest import azurite  # noqa: F401  (the fixture)
from tests.security.process_memory import peak_growth, resident
from tests.security.test_storage_tenancy import provision_key, staging_from

FORGED = (
    'Error creating: pods "mine-stage-x" is forbidden: violates PodSecurity "restricted:latest": '
    "runAsNonRoot != true"
)


@pytest.fixture
def chart_sets() -> tuple[str, ...]:
    """Azurite's account allowed and any container readable: tenant A's job stages its dataset from it."""
    return (f"storagePolicy.accounts[0]={DEV_ACCOUNT_NAME}", "storagePolicy.readContainers[0]=*")


def event_poster(cluster: TenantCluster, namespace: str) -> client.CoreV1Api:
    """A ServiceAccount of `namespace` that may post Events there, and nothing else."""
    account = f"poster-{uuid.uuid4().hex[:6]}"
    meta = client.V1ObjectMeta(name=account)
    cluster.core.create_namespaced_service_account(namespace, client.V1ServiceAccount(metadata=meta))
    rule = client.V1PolicyRule(api_groups=[""], resources=["events"], verbs=["create"])
    cluster.rbac.create_namespaced_role(namespace, client.V1Role(metadata=meta, rules=[rule]))
    binding = client.V1RoleBinding(
        metadata=meta,
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=account),
        subjects=[client.RbacV1Subject(kind="ServiceAccount", name=account, namespace=namespace)],
    )
    cluster.rbac.create_namespaced_role_binding(namespace, binding)
    token = service_account_token(cluster.core, namespace, account)
    path = token_kubeconfig(cluster.admin_kubeconfig, token, cluster.workdir / f"{account}.kubeconfig")
    return client.CoreV1Api(config.new_client_from_config(config_file=path))


@pytest.mark.azure
def test_a_refusal_forged_in_another_namespace_cannot_fail_a_tenants_job(
    cluster: TenantCluster,
    tenant_a: Tenant,
    tenant_b: Tenant,
    operator: OperatorProcess,
    api_client: client.ApiClient,
    azurite: Azurite,  # noqa: F811
) -> None:
    # Tenant A's pod quota holds no pod: its staging Job's pod is refused, and the job waits in Staging,
    # quoting the quota, until its startup deadline.
    quota = client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="pods"), spec=client.V1ResourceQuotaSpec(hard={"pods": "0"})
    )
    core, namespace = client.CoreV1Api(api_client), tenant_a.namespace
    core.create_namespaced_resource_quota(namespace, quota)
    wait_for(
        lambda: (core.read_namespaced_resource_quota("pods", namespace).status.hard or {}).get("pods"),
        timeout=30, what="the quota's status",
    )  # fmt: skip
    data = f"data-{uuid.uuid4().hex[:10]}"
    blob = BlobServiceClient(azurite.endpoint, credential=azurite.account_key)
    blob.create_container(data).upload_blob("runs/train/x.bin", b"a dataset")
    provision_key(api_client, namespace, azurite)
    tenant_a.jobs().create("mine", runPolicy={"startupDeadlineSeconds": 900}, **staging_from(azurite, data))
    mine = Jobs(api_client, namespace)
    stage_name = names.staging_job_name("mine")

    def quoting_the_quota() -> dict[str, str] | None:
        cond = mine.condition("mine", "Staged")
        return cond if cond and cond["reason"] == "PodRefused" else None

    cond = wait_for(quoting_the_quota, timeout=120, what="Staged=False quoting the quota")
    assert f"Job {stage_name}" in cond["message"] and "exceeded quota: pods" in cond["message"], cond
    stage = client.BatchV1Api(api_client).read_namespaced_job(stage_name, namespace)

    # Tenant B's account posts, in its own namespace, a Pod Security refusal naming A's staging Job, dated
    # ahead so that it would be the newest of that Job's refusals.
    now = datetime.now(UTC) + timedelta(hours=1)
    forged = client.CoreV1Event(
        metadata=client.V1ObjectMeta(name=f"{stage_name}.{uuid.uuid4().hex[:8]}"),
        involved_object=client.V1ObjectReference(
            api_version="batch/v1", kind="Job", namespace=tenant_b.namespace, name=stage_name,
            uid=stage.metadata.uid,
        ),
        reason="FailedCreate", type="Warning", message=FORGED, count=1, first_timestamp=now,
        last_timestamp=now, source=client.V1EventSource(component="job-controller"),
    )  # fmt: skip
    event_poster(cluster, tenant_b.namespace).create_namespaced_event(tenant_b.namespace, forged)

    # A's job is looked at again (the cluster admin's annotation), with the forged Event delivered by then.
    seen = operator.reconciles()
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "mine",
        {"metadata": {"annotations": {"example.com/look": "again"}}},
    )  # fmt: skip
    wait_for(lambda: operator.reconciles() >= seen + 2, timeout=60, what="two more reconciles")
    status = mine.status("mine")
    assert status["phase"] == "Staging", status
    assert not mine.condition("mine", "Failed"), status
    cond = mine.condition("mine", "Staged") or {}
    assert "exceeded quota: pods" in cond.get("message", "") and "PodSecurity" not in cond.get("message", "")
    # The staging Job is still the one that waits for room: not deleted as a failed job's.
    kept = client.BatchV1Api(api_client).read_namespaced_job(stage_name, namespace)
    assert kept.metadata.uid == stage.metadata.uid and kept.metadata.deletion_timestamp is None


def test_refusals_naming_uids_no_job_has_cannot_fill_the_operators_memory(
    cluster: TenantCluster, tenant_b: Tenant, operator: OperatorProcess
) -> None:
    """The API server takes any string as an Event's involvedObject.uid. Kept, 40 such Events of 1 MB from
    tenant B's poster, each a FailedCreate naming a staging Job (the refusals the operator watches), would
    add 40 MB to the operator that serves every tenant (a few hundred: past its memory limit, and again at
    every start, from the LIST): it must keep none of them."""
    assert operator.proc is not None
    pid, namespace = operator.proc.pid, tenant_b.namespace
    poster = event_poster(cluster, namespace)
    before = resident(pid)
    now = datetime.now(UTC)
    for i in range(40):
        poster.create_namespaced_event(namespace, client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=f"padded.{i}.{uuid.uuid4().hex[:8]}"),
            involved_object=client.V1ObjectReference(
                api_version="batch/v1", kind="Job", namespace=namespace,
                name=names.staging_job_name("padded"), uid="u" * 1_000_000,
            ),
            reason="FailedCreate", type="Warning", message="padded", count=1, first_timestamp=now,
            last_timestamp=now, source=client.V1EventSource(component="job-controller"),
        ))  # fmt: skip
    try:
        grown = peak_growth(pid, before, 15)
        assert grown < 20_000_000, f"the operator grew by {grown / 1e6:.0f} MB"
        assert operator.proc.poll() is None
    finally:
        cluster.core.delete_collection_namespaced_event(namespace)
