"""A job runs the pods its editor describes: where its namespace enforces no Pod Security level, a template
may ask for a privileged container or the host's namespaces, and the editor gets the node. With the chart's
`admissionPolicy.requirePodSecurity`, a job is created only in a namespace that enforces baseline or
restricted: real helm renders the policy, the real API server runs it, a tenant's editor applies."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed.kube_wait import wait_for
from testbed.operator_harness import GROUP, PLURAL, VERSION, kubectl
from testbed.tenancy import POLICY_KINDS, Tenant, TenantCluster

ENFORCE = "pod-security.kubernetes.io/enforce"
MARK = "dtjob.io/test-pod-security"


@pytest.fixture
def chart_sets() -> tuple[str, ...]:
    return ("admissionPolicy.requirePodSecurity=true",)


@pytest.fixture
def mark() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture
def policy(cluster: TenantCluster, kubeconfig: str, mark: str) -> Iterator[None]:
    """The chart's policy, its binding narrowed to the namespaces marked (other tests' jobs never meet it)."""
    docs = [copy.deepcopy(d) for d in cluster.docs
            if d["kind"] in POLICY_KINDS and d["metadata"]["name"].endswith("-pod-security")]  # fmt: skip
    assert [d["kind"] for d in docs] == list(POLICY_KINDS), "the chart renders the policy and its binding"
    docs[1]["spec"]["matchResources"] = {"namespaceSelector": {"matchLabels": {MARK: mark}}}
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
    applied = kubectl(kubeconfig, "apply", "-f", "-", stdin=manifest)
    assert applied.returncode == 0, applied.stderr
    try:
        yield
    finally:
        kubectl(kubeconfig, "delete", "--ignore-not-found", "-f", "-", stdin=manifest)


def job(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "DistributedTrainingJob", "metadata": {"name": name},
            "spec": {"framework": "pytorch", "workers": 1, "gpusPerWorker": 0, **spec}}  # fmt: skip


def refusal(editor: client.ApiClient, namespace: str, body: dict[str, Any]) -> str | None:
    try:
        client.CustomObjectsApi(editor).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body, dry_run="All"
        )
    except ApiException as err:
        assert err.status == 403, err.body
        return str(json.loads(err.body or "{}").get("message", ""))
    return None


def test_a_job_is_refused_in_a_namespace_that_enforces_no_pod_security_level(
    tenant_a: Tenant, api_client: client.ApiClient, policy: None, mark: str
) -> None:
    core = client.CoreV1Api(api_client)
    editor = tenant_a.api()
    root = {"worker": {"template": {"spec": {"hostPID": True}}}}

    def label(level: str | None) -> None:
        core.patch_namespace(tenant_a.namespace, {"metadata": {"labels": {MARK: mark, ENFORCE: level}}})

    label(None)
    wait_for(lambda: refusal(editor, tenant_a.namespace, job("probe")) is not None, timeout=30,
             what="the policy in force")  # fmt: skip
    said = refusal(editor, tenant_a.namespace, job("root", **root))
    assert said is not None and f"namespace {tenant_a.namespace} enforces no Pod Security level" in said
    assert f"label it {ENFORCE}=restricted" in said
    label("privileged")
    wait_for(lambda: refusal(editor, tenant_a.namespace, job("root", **root)) is not None, timeout=30,
             what="privileged refused")  # fmt: skip
    for level in ("baseline", "restricted"):
        label(level)
        wait_for(lambda: refusal(editor, tenant_a.namespace, job("plain")) is None, timeout=30,
                 what=f"{level} admitted")  # fmt: skip
    # A job MultiKueue runs elsewhere is judged where it runs.
    label(None)
    wait_for(lambda: refusal(editor, tenant_a.namespace, job("probe")) is not None, timeout=30,
             what="the label gone")  # fmt: skip
    assert (
        refusal(editor, tenant_a.namespace, job("dispatched", managedBy="kueue.x-k8s.io/multikueue")) is None
    )


def test_the_operators_token_makes_pods_only_where_a_pod_security_level_is_enforced(
    tenant_a: Tenant, api_client: client.ApiClient, operator_api: client.ApiClient
) -> None:
    """An owner reference is its writer's to copy: with requirePodSecurity, the operator's guard lets its
    token make pods only in namespaces that enforce a level, so a thief of it cannot make a privileged pod
    where none is enforced; where one is, the namespace's Pod Security refuses it."""
    ns = tenant_a.namespace
    held: Any = client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, job("held")
    )
    owner = [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "DistributedTrainingJob", "name": "held",
              "uid": held["metadata"]["uid"], "controller": True}]  # fmt: skip
    thief = client.CoreV1Api(operator_api)

    def refused(privileged: bool) -> str | None:
        worker = {"name": "worker", "image": "busybox", "securityContext": {"privileged": privileged}}
        meta = {"name": "held-worker-0", "ownerReferences": owner}
        pod: Any = {"metadata": meta, "spec": {"containers": [worker]}}
        try:
            thief.create_namespaced_pod(ns, pod, dry_run="All")
        except ApiException as err:
            assert err.status == 403, err.body
            return str(json.loads(err.body or "{}").get("message", ""))
        return None

    where = f"makes pods only in namespaces that enforce a Pod Security level, not in {ns}"
    wait_for(lambda: where in (refused(True) or ""), timeout=30, what="the guard in force")
    assert where in (refused(False) or "")
    client.CoreV1Api(api_client).patch_namespace(ns, {"metadata": {"labels": {ENFORCE: "baseline"}}})
    wait_for(lambda: refused(False) is None, timeout=30, what="a plain pod made where baseline is enforced")
    said = refused(True)
    assert said is not None and 'violates PodSecurity "baseline' in said, said
