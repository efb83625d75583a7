"""The rights the threat model gives each actor, as the chart and Kubernetes' built-in roles grant them on a
real API server: what each attack in this suite may assume and nothing more. A chart change that widens the
edit role, or gives the operator Secrets it may list, fails here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from testbed.operator_harness import GROUP, PLURAL, VERSION, Jobs
from testbed.tenancy import (
    ADMIN,
    EDITOR,
    Tenant,
    TenantCluster,
    refused,
    service_account_token,
    token_kubeconfig,
)


def test_an_editor_manages_jobs_and_nothing_the_operator_guards(
    tenant_a: Tenant, tenant_b: Tenant, api_client: client.ApiClient
) -> None:
    editor = tenant_a.jobs(EDITOR)
    job = editor.create("mine", workers=1, gpusPerWorker=1)
    ns = tenant_a.namespace
    core, custom = tenant_a.core(EDITOR), client.CustomObjectsApi(tenant_a.api(EDITOR))
    status = {"status": {"phase": "Succeeded"}}
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="p"),
        spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="x")]),
    )
    assert refused(lambda: core.list_namespaced_secret(ns)), "an editor reads no Secret"
    assert refused(lambda: core.read_namespaced_secret("anything", ns))
    assert refused(lambda: core.create_namespaced_pod(ns, pod)), "an editor creates no pod itself"
    assert refused(
        lambda: custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, "mine", status)
    )
    assert refused(lambda: Jobs(tenant_a.api(EDITOR), tenant_b.namespace).create("theirs"))
    assert refused(lambda: client.CustomObjectsApi(tenant_a.api(EDITOR)).list_namespaced_custom_object(
        GROUP, VERSION, tenant_b.namespace, PLURAL))  # fmt: skip
    assert job["metadata"]["name"] == "mine"


def test_an_admin_may_not_widen_its_own_storage_lists_or_publish_hosts(tenant_a: Tenant) -> None:
    """Namespace annotations say what storage a namespace may use; EndpointSlices, who a job's hosts are."""
    ns = tenant_a.namespace
    core = tenant_a.core(ADMIN)
    annotation = {"metadata": {"annotations": {"dtjob.io/write-containers": "*", "dtjob.io/nfs-shares": "*"}}}
    assert refused(lambda: core.patch_namespace(ns, annotation))
    slice_ = client.V1EndpointSlice(
        address_type="IPv4",
        metadata=client.V1ObjectMeta(name="forged", labels={"kubernetes.io/service-name": "job-workers"}),
        endpoints=[],
    )
    assert refused(
        lambda: client.DiscoveryV1Api(tenant_a.api(ADMIN)).create_namespaced_endpoint_slice(ns, slice_)
    )
    assert not refused(lambda: core.list_namespaced_secret(ns)), "an admin does read its namespace's Secrets"


@pytest.mark.parametrize("verb", ["list", "watch"])
def test_the_operator_lists_no_secret_anywhere(
    cluster: TenantCluster, tenant_a: Tenant, api_client: client.ApiClient, tmp_path: Any, verb: str
) -> None:
    """The operator reads Secrets by name only: a job's own, an opted-in account key, one a template names."""
    token = service_account_token(client.CoreV1Api(api_client), cluster.release_ns, cluster.service_account)
    operator = config.new_client_from_config(
        config_file=token_kubeconfig(cluster.admin_kubeconfig, token, tmp_path / "op")
    )
    review = client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(
                verb=verb, resource="secrets", namespace=tenant_a.namespace
            )
        )
    )
    answer = client.AuthorizationV1Api(operator).create_self_subject_access_review(review)
    assert answer.status.allowed is False


def invalid(call: Callable[[], Any]) -> bool:
    """Whether the API server refuses the call as invalid (422: the CRD's schema or CEL rules)."""
    try:
        call()
    except ApiException as err:
        return bool(err.status == 422)
    return False


def test_an_editor_can_neither_switch_a_world_to_torchrun_nor_resize_a_torchrun_world_by_its_labels(
    tenant_a: Tenant,
) -> None:
    """spec.torchrun is fixed at creation (a running MPI world never becomes a torchrun one, nor the reverse),
    refuses a launcher beside it, and the world-size label the operator reads on a torchrun worker, and on an
    MPI world's launcher pod, is out of an editor's reach (it may patch no pod)."""
    editor = tenant_a.jobs(EDITOR)
    ns = tenant_a.namespace
    custom = client.CustomObjectsApi(tenant_a.api(EDITOR))
    editor.create("mpi-world", workers=1, gpusPerWorker=1)
    editor.create("ddp-world", workers=1, gpusPerWorker=1, torchrun={})

    def patch(name: str, body: Any) -> Callable[[], Any]:
        return lambda: custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, body)

    assert invalid(patch("mpi-world", {"spec": {"torchrun": {}}}))
    assert invalid(patch("ddp-world", {"spec": {"torchrun": None}}))  # a merge patch's removal
    assert invalid(patch("ddp-world", {"spec": {"launcher": {"runner": "mpirun"}}}))
    label = {"metadata": {"labels": {"dtjob.io/world-size": "1"}}}
    assert refused(lambda: tenant_a.core(EDITOR).patch_namespaced_pod("ddp-world-worker-0", ns, label))
    assert refused(lambda: tenant_a.core(EDITOR).patch_namespaced_pod("mpi-world-launcher", ns, label))


def test_an_editor_cannot_have_its_pods_hold_their_gpus_past_the_grace_bound(tenant_a: Tenant) -> None:
    """A template's terminationGracePeriodSeconds keeps a preempted, suspended or restarted world's pods, with
    their GPUs and quota, for as long as its trainer ignores SIGTERM: a year would hold them from the job that
    preempted it. The API server refuses more than the bound at create and at edit, naming the field."""
    editor = tenant_a.jobs(EDITOR)
    ns = tenant_a.namespace
    custom = client.CustomObjectsApi(tenant_a.api(EDITOR))
    year = {"spec": {"terminationGracePeriodSeconds": 31_536_000}}
    for role in ("worker", "launcher"):
        try:
            editor.create(f"hold-{role}", **{role: {"template": year}})
        except ApiException as err:
            assert err.status == 422, err
            assert f"spec.{role}.template.spec.terminationGracePeriodSeconds" in str(err.body), err.body
            assert "at most 600 seconds" in str(err.body), err.body
        else:
            raise AssertionError(f"a {role} template holding its pods for a year was created")
    editor.create("bounded", worker={"template": {"spec": {"terminationGracePeriodSeconds": 600}}})
    edit = {"spec": {"worker": {"template": year}}}
    assert invalid(lambda: custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "bounded", edit))
