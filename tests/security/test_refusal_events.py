"""Why a launcher's pod has not been created comes from the Job controller's FailedCreate Events, which the
operator watches in every namespace it serves. Any account that may post Events (many workloads' may) can
write one naming any Job's uid. If it is written in another namespace, it must say nothing about a tenant's
job: a forged Pod Security refusal would fail the job at once and free its GPUs for the forger's queue."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from kubernetes import client, config

from testbed.kube_wait import wait_for
from testbed.operator_harness import GROUP, PLURAL, VERSION, Jobs, OperatorProcess
from testbed.tenancy import Tenant, TenantCluster, service_account_token, token_kubeconfig
from tests.security.process_memory import peak_growth, resident

FORGED = (
    'Error creating: pods "mine-launcher-x" is forbidden: violates PodSecurity "restricted:latest": '
    "runAsNonRoot != true"
)


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


def test_a_refusal_forged_in_another_namespace_cannot_fail_a_tenants_job(
    cluster: TenantCluster,
    tenant_a: Tenant,
    tenant_b: Tenant,
    operator: OperatorProcess,
    api_client: client.ApiClient,
) -> None:
    # Tenant A's pod quota holds its two workers and not its launcher: the launcher's pod is refused, and
    # the job waits in Starting, quoting the quota, until its startup deadline.
    quota = client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="pods"), spec=client.V1ResourceQuotaSpec(hard={"pods": "2"})
    )
    core, namespace = client.CoreV1Api(api_client), tenant_a.namespace
    core.create_namespaced_resource_quota(namespace, quota)
    wait_for(
        lambda: (core.read_namespaced_resource_quota("pods", namespace).status.hard or {}).get("pods"),
        timeout=30, what="the quota's status",
    )  # fmt: skip
    tenant_a.jobs().create("mine", runPolicy={"startupDeadlineSeconds": 900})
    mine = Jobs(api_client, tenant_a.namespace)

    def quoting_the_quota() -> dict[str, str] | None:
        cond = mine.condition("mine", "Created")
        return cond if cond and cond["reason"] == "PodRefused" else None

    cond = wait_for(quoting_the_quota, timeout=120, what="Created=False quoting the quota")
    assert "exceeded quota: pods" in cond["message"], cond
    launcher = client.BatchV1Api(api_client).read_namespaced_job("mine-launcher", tenant_a.namespace)

    # Tenant B's account posts, in its own namespace, a Pod Security refusal naming A's launcher Job, dated
    # ahead so that it would be the newest of that Job's refusals.
    now = datetime.now(UTC) + timedelta(hours=1)
    forged = client.CoreV1Event(
        metadata=client.V1ObjectMeta(name=f"mine-launcher.{uuid.uuid4().hex[:8]}"),
        involved_object=client.V1ObjectReference(
            api_version="batch/v1", kind="Job", namespace=tenant_b.namespace, name="mine-launcher",
            uid=launcher.metadata.uid,
        ),
        reason="FailedCreate", type="Warning", message=FORGED, count=1, first_timestamp=now,
        last_timestamp=now, source=client.V1EventSource(component="job-controller"),
    )  # fmt: skip
    event_poster(cluster, tenant_b.namespace).create_namespaced_event(tenant_b.namespace, forged)

    # A's job is looked at again (the cluster admin's annotation), with the forged Event delivered by then.
    seen = operator.reconciles()
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, tenant_a.namespace, PLURAL, "mine",
        {"metadata": {"annotations": {"example.com/look": "again"}}},
    )  # fmt: skip
    wait_for(lambda: operator.reconciles() >= seen + 2, timeout=60, what="two more reconciles")
    status = mine.status("mine")
    assert status["phase"] == "Starting", status
    cond = mine.condition("mine", "Created") or {}
    assert "exceeded quota: pods" in cond.get("message", "") and "PodSecurity" not in cond.get("message", "")
    assert len(mine.live_workers("mine")) == 2


def test_refusals_naming_uids_no_job_has_cannot_fill_the_operators_memory(
    cluster: TenantCluster, tenant_b: Tenant, operator: OperatorProcess
) -> None:
    """The API server takes any string as an Event's involvedObject.uid. Kept, 40 such Events of 1 MB from
    tenant B's poster would add 40 MB to the operator that serves every tenant (a few hundred: past its
    memory limit, and again at every start, from the LIST): it must keep none of them."""
    assert operator.proc is not None
    pid, namespace = operator.proc.pid, tenant_b.namespace
    poster = event_poster(cluster, namespace)
    before = resident(pid)
    now = datetime.now(UTC)
    for i in range(40):
        poster.create_namespaced_event(namespace, client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=f"padded.{i}.{uuid.uuid4().hex[:8]}"),
            involved_object=client.V1ObjectReference(
                api_version="batch/v1", kind="Job", namespace=namespace, name="padded", uid="u" * 1_000_000
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
