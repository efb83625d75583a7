"""Whoever takes the operator's pod, or its ServiceAccount's token, holds its RBAC: in a cluster-wide install,
pods, Secrets, ConfigMaps and Services in every namespace. The chart's guard (a ValidatingAdmissionPolicy on
that ServiceAccount) keeps those rights to what the operator does: children of a DistributedTrainingJob,
Opaque Secrets, its jobs' headless Services and their EndpointSlices, a pod's images never changed, nothing
in kube-system. Each attack here
acts with the operator's own token, is one RBAC allows (checked first), and is refused; the operator's own
writes pass (every attack in tests/security runs the operator under the guard)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from dtjob import API_GROUP, API_VERSION, KIND
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed.kube_wait import wait_for
from testbed.operator_harness import GROUP, PLURAL, VERSION
from testbed.tenancy import Tenant, TenantCluster


def owned_by(job: dict[str, Any]) -> list[dict[str, Any]]:
    meta = job["metadata"]
    return [{"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": KIND, "name": meta["name"],
             "uid": meta["uid"], "controller": True}]  # fmt: skip


def refusal(call: Any) -> str:
    with pytest.raises(ApiException) as refused:
        call()
    assert refused.value.status == 403, refused.value.body
    return str(json.loads(refused.value.body or "{}").get("message", ""))


def allowed_by_rbac(cluster: TenantCluster, verb: str, resource: str, namespace: str) -> bool:
    review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
        user=f"system:serviceaccount:{cluster.release_ns}:{cluster.service_account}",
        groups=["system:serviceaccounts", f"system:serviceaccounts:{cluster.release_ns}"],
        resource_attributes=client.V1ResourceAttributes(verb=verb, resource=resource, namespace=namespace),
    ))  # fmt: skip
    answer = client.AuthorizationV1Api(cluster.admin).create_subject_access_review(review)
    return bool(answer.status.allowed)


def test_the_operators_stolen_token_cannot_take_the_cluster(
    cluster: TenantCluster, tenant_a: Tenant, api_client: client.ApiClient, operator_api: client.ApiClient
) -> None:
    ns = tenant_a.namespace
    core = client.CoreV1Api(operator_api)
    for verb, resource, where in (("create", "configmaps", "kube-system"), ("create", "pods", "kube-system"),
                                  ("create", "secrets", ns), ("patch", "pods", ns),
                                  ("create", "services", ns)):  # fmt: skip
        assert allowed_by_rbac(cluster, verb, resource, where), (verb, resource, where)
    held = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": {"name": "held"},
            "spec": {"framework": "pytorch", "workers": 1, "gpusPerWorker": 0}}  # fmt: skip
    job: Any = client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, held
    )
    owner = owned_by(job)
    dns: Any = {"metadata": {"name": "coredns-custom"}, "data": {"evil.server": "forward . 10.0.0.66"}}
    wait_for(  # a dry run: admission judges it, nothing is stored
        lambda: _refused(lambda: core.create_namespaced_config_map("kube-system", dns, dry_run="All")),
        timeout=30, what="the guard in force",
    )  # fmt: skip
    said = refusal(lambda: core.create_namespaced_config_map("kube-system", dns))
    assert "writes nothing in namespace kube-system" in said
    privileged: Any = {"metadata": {"name": "root", "ownerReferences": owner}, "spec": {"containers": [
        {"name": "c", "image": "busybox", "securityContext": {"privileged": True}}]}}  # fmt: skip
    assert "nothing in namespace kube-system" in refusal(
        lambda: core.create_namespaced_pod("kube-system", privileged)
    )
    token: Any = {"metadata": {"name": "admin-token", "ownerReferences": owner,
                          "annotations": {"kubernetes.io/service-account.name": "default"}},
             "type": "kubernetes.io/service-account-token"}  # fmt: skip
    assert "only Opaque Secrets" in refusal(lambda: core.create_namespaced_secret(ns, token))
    stray: Any = {"metadata": {"name": "stray"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    assert "only objects a DistributedTrainingJob owns" in refusal(
        lambda: core.create_namespaced_pod(ns, stray)
    )
    exposed: Any = {"metadata": {"name": "held-workers", "ownerReferences": owner},
               "spec": {"ports": [{"port": 22}], "externalIPs": ["10.0.0.1"]}}  # fmt: skip
    assert "without externalIPs" in refusal(lambda: core.create_namespaced_service(ns, exposed))
    _services_and_slices_are_the_jobs_own(api_client, operator_api, ns, owner)
    # A pod of the job (made by the namespace's admin, as the operator would): its image is never swapped,
    # while what the operator does write to its pods (annotations, finalizers, gates) passes.
    pod: Any = {
        "metadata": {"name": "held-worker-0", "ownerReferences": owner},
        "spec": {"containers": [{"name": "worker", "image": "busybox"}], "schedulingGates": [{"name": "x"}]},
    }
    client.CoreV1Api(api_client).create_namespaced_pod(ns, pod)
    swap: Any = {"spec": {"containers": [{"name": "worker", "image": "evil.example/root:1"}]}}
    assert "never changes a running pod's images" in refusal(
        lambda: core.patch_namespaced_pod("held-worker-0", ns, swap)
    )
    core.patch_namespaced_pod("held-worker-0", ns, {"metadata": {"annotations": {"dtjob.io/mark": "1"}}})
    # The operator's own kinds of write pass: an Opaque Secret its job owns.
    mine: Any = {"metadata": {"name": "held-ssh", "ownerReferences": owner}, "type": "Opaque", "data": {}}
    assert core.create_namespaced_secret(ns, mine).metadata.name == "held-ssh"


def _services_and_slices_are_the_jobs_own(
    api_client: client.ApiClient, operator_api: client.ApiClient, ns: str, owner: list[dict[str, Any]]
) -> None:
    """An EndpointSlice that names a Service (kubernetes.io/service-name) sends that Service's traffic to its
    addresses: the operator's are its job's <job>-workers, serving that Service only."""
    web: Any = {"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}], "selector": {"app": "web"}}}
    client.CoreV1Api(api_client).create_namespaced_service(ns, web)
    core, discovery = client.CoreV1Api(operator_api), client.DiscoveryV1Api(operator_api)

    def endpoint_slice(name: str, service: str) -> Any:
        return {"metadata": {"name": name, "ownerReferences": owner,
                             "labels": {"kubernetes.io/service-name": service}},
                "addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.66"]}],
                "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}  # fmt: skip

    for name, service in (("web-extra", "web"), ("held-workers", "web")):
        body = endpoint_slice(name, service)
        said = refusal(lambda body=body: discovery.create_namespaced_endpoint_slice(ns, body))
        assert "are its jobs' <job>-workers" in said, (name, service, said)
    other: Any = {"metadata": {"name": "web2", "ownerReferences": owner},
                  "spec": {"clusterIP": "None", "ports": [{"port": 22}]}}  # fmt: skip
    assert "are its jobs' <job>-workers" in refusal(lambda: core.create_namespaced_service(ns, other))
    clustered: Any = {"metadata": {"name": "held-workers", "ownerReferences": owner},
                      "spec": {"ports": [{"port": 22}]}}  # fmt: skip
    assert "are headless" in refusal(lambda: core.create_namespaced_service(ns, clustered))
    headless: Any = {"metadata": {"name": "held-workers", "ownerReferences": owner},
                     "spec": {"clusterIP": "None", "ports": [{"port": 22}]}}  # fmt: skip
    assert core.create_namespaced_service(ns, headless, dry_run="All").metadata.name == "held-workers"
    own_slice = endpoint_slice("held-workers", "held-workers")
    assert discovery.create_namespaced_endpoint_slice(ns, own_slice, dry_run="All").metadata.name


def _refused(call: Any) -> bool:
    try:
        call()
    except ApiException as err:
        return err.status == 403 and "dtjob operator" in (err.body or "")
    return False


def test_the_gate_of_an_earlier_releases_launcher_pod_comes_off_and_nothing_else(
    cluster: TenantCluster, tenant_a: Tenant, api_client: client.ApiClient, operator_api: client.ApiClient
) -> None:
    """A world an earlier release started has a launcher Job, which owns its pod, held by the gate
    dtjob.io/workers-ready until every worker is Ready: the operator takes that gate off (its only write to a
    pod no DistributedTrainingJob owns), and the guard lets it; any other change to such a pod is refused."""
    ns = tenant_a.namespace
    container = {"name": "launcher", "image": "busybox"}
    launcher: Any = {"metadata": {"name": "old-launcher"}, "spec": {"suspend": True, "template": {
        "spec": {"restartPolicy": "Never", "containers": [container]}}}}  # fmt: skip
    batch_job = client.BatchV1Api(api_client).create_namespaced_job(ns, launcher)
    # Not its controller: the Job controller releases a pod it controls that its selector does not match,
    # which would take the owner reference off mid-test (the guard reads any batch Job owner alike).
    owner = [{"apiVersion": "batch/v1", "kind": "Job", "name": "old-launcher", "uid": batch_job.metadata.uid,
              "controller": False}]  # fmt: skip
    gates = [{"name": "dtjob.io/workers-ready"}, {"name": "example.com/theirs"}]
    pod: Any = {
        "metadata": {"name": "old-launcher-abcde", "ownerReferences": owner},
        "spec": {"containers": [{"name": "launcher", "image": "busybox"}], "schedulingGates": gates,
                 "tolerations": [{"key": "a", "operator": "Exists", "effect": "NoSchedule"}]},
    }  # fmt: skip
    client.CoreV1Api(api_client).create_namespaced_pod(ns, pod)
    core = client.CoreV1Api(operator_api)
    relabel = {"metadata": {"labels": {"dtjob.io/role": "worker"}}}
    name = "old-launcher-abcde"
    wait_for(lambda: _refused(lambda: core.patch_namespaced_pod(name, ns, relabel, dry_run="All")),
             timeout=30, what="the guard in force")  # fmt: skip
    other_gate = [{"op": "remove", "path": "/spec/schedulingGates/1"}]
    assert "only objects a DistributedTrainingJob owns" in refusal(
        lambda: core.patch_namespaced_pod("old-launcher-abcde", ns, other_gate)
    )
    ours = [{"op": "test", "path": "/spec/schedulingGates/0/name", "value": "dtjob.io/workers-ready"},
            {"op": "remove", "path": "/spec/schedulingGates/0"}]  # fmt: skip
    for more in ({"op": "add", "path": "/metadata/labels", "value": {"app": "web"}},
                 {"op": "add", "path": "/spec/nodeSelector", "value": {"pool": "theirs"}},
                 {"op": "add", "path": "/spec/tolerations/-", "value": {"operator": "Exists"}}):  # fmt: skip
        assert "only objects a DistributedTrainingJob owns" in refusal(
            lambda more=more: core.patch_namespaced_pod("old-launcher-abcde", ns, [*ours, more])
        ), more
    released = core.patch_namespaced_pod("old-launcher-abcde", ns, ours)
    assert [g.name for g in released.spec.scheduling_gates] == ["example.com/theirs"]
