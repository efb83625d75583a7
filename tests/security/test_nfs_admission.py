"""The chart's admission policy says at `kubectl apply` what the operator says when it makes a job's pods: a
share in spec.dataset.volume.nfs or spec.checkpoints.nfs that the namespace's list does not admit. Real helm
renders the policy, the real API server runs its CEL, and a tenant's editor applies. Two implementations of
one rule must agree: every case here is judged by both, the policy and dtjob.spec.nfs_shares, and each verdict
compared. The operator's own refusal, which holds without the policy, is tests/security/test_nfs_shares.py's.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from dtjob.spec.nfs_shares import cluster_shares, namespace_shares
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed.kube_wait import wait_for
from testbed.operator_harness import GROUP, PLURAL, VERSION, Jobs, kubectl
from testbed.tenancy import Tenant, TenantCluster

SERVER = "10.40.0.4"
TEAM_A = "/export/team-a"
TEAM_B = "/export/team-b"
CLUSTER_LIST = f"{SERVER}:{TEAM_A}"
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
# Namespaces this module judges: the binding is narrowed to them, so that other tests' jobs on the same API
# server never meet the policy.
MARK = "dtjob.io/test-nfs-admission"


@pytest.fixture
def chart_sets() -> tuple[str, ...]:
    return (f"storagePolicy.nfsShares[0]={CLUSTER_LIST}",)


@pytest.fixture
def mark() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture
def policy(cluster: TenantCluster, kubeconfig: str, mark: str) -> Iterator[list[dict[str, Any]]]:
    """The chart's policy and binding as helm rendered them, the binding narrowed to namespaces marked."""
    docs = [
        copy.deepcopy(d)
        for d in cluster.docs
        if d["kind"] in POLICY_KINDS and d["metadata"]["name"].endswith("-nfs-shares")
    ]
    assert [d["kind"] for d in docs] == list(POLICY_KINDS), "the chart renders the policy and its binding"
    binding = docs[1]
    assert "matchResources" not in binding["spec"], "a cluster-wide install binds every namespace"
    binding["spec"]["matchResources"] = {"namespaceSelector": {"matchLabels": {MARK: mark}}}
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
    applied = kubectl(kubeconfig, "apply", "-f", "-", stdin=manifest)
    assert applied.returncode == 0, applied.stderr
    try:
        yield docs
    finally:
        kubectl(kubeconfig, "delete", "--ignore-not-found", "-f", "-", stdin=manifest)


def job(name: str, server: str, path: str, field: str = "dataset", **spec: Any) -> dict[str, Any]:
    share = {"nfs": {"server": server, "path": path}}
    body_spec: dict[str, Any] = {"framework": "pytorch", "workers": 1, "gpusPerWorker": 0, **spec}
    body_spec[field] = {"volume": share} if field == "dataset" else share
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DistributedTrainingJob",
        "metadata": {"name": name},
        "spec": body_spec,
    }


def refusal(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> str | None:
    """The API server's refusal of creating `body` (a dry run: nothing is stored), or None."""
    try:
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body, dry_run="All"
        )
    except ApiException as err:
        if err.status in (403, 422):
            return str(json.loads(err.body or "{}").get("message", err.body))
        raise
    return None


def mark_namespace(api: client.ApiClient, namespace: str, mark: str, shares: str | None) -> None:
    annotations = {"dtjob.io/nfs-shares": shares} if shares is not None else {}
    client.CoreV1Api(api).patch_namespace(
        namespace, {"metadata": {"labels": {MARK: mark}, "annotations": annotations}}
    )


def wait_judged(api: client.ApiClient, namespace: str, refused_body: dict[str, Any]) -> None:
    """Until the policy (and the namespace's labels, which bind it) reached the API server's admission."""
    wait_for(
        lambda: refusal(api, namespace, refused_body) is not None, timeout=30, what="the policy in force"
    )


def test_an_editor_naming_another_teams_export_is_refused_at_apply_naming_the_field(
    tenant_a: Tenant, api_client: client.ApiClient, policy: list[dict[str, Any]], mark: str
) -> None:
    """Tenant A's editor applies jobs that name team B's export on the same server, through the dataset and
    through the checkpoints: each is refused at apply with the operator's words, the field first, and nothing
    is stored. Its own export is admitted."""
    mark_namespace(api_client, tenant_a.namespace, mark, None)
    editor = tenant_a.api()
    wait_judged(editor, tenant_a.namespace, job("probe", SERVER, TEAM_B))
    custom = client.CustomObjectsApi(editor)
    for field, shown in (("dataset", "spec.dataset.volume.nfs"), ("checkpoints", "spec.checkpoints.nfs")):
        with pytest.raises(ApiException) as refused:
            custom.create_namespaced_custom_object(
                GROUP, VERSION, tenant_a.namespace, PLURAL, job(f"b-{field}", SERVER, TEAM_B, field)
            )
        message = json.loads(refused.value.body or "{}")["message"]
        assert refused.value.status == 403, message
        assert f"{shown}: NFS share {SERVER}:{TEAM_B} is not one this namespace's jobs may mount" in message
        assert f"allowed: {CLUSTER_LIST} (operator setting DTJOB_NFS_SHARES)" in message
        assert Jobs(api_client, tenant_a.namespace).get(f"b-{field}") is None
    mine = custom.create_namespaced_custom_object(
        GROUP, VERSION, tenant_a.namespace, PLURAL, job("a", SERVER, f"{TEAM_A}/imagenet", "checkpoints")
    )
    assert mine["metadata"]["name"] == "a"


LISTS: tuple[str | None, ...] = (
    None,  # the installer's list
    "",  # none
    "*",
    "FILES.example.com",
    f" {SERVER}:{TEAM_A}/ ,\t{SERVER}:/export//shared",
    f"{SERVER}:/export/../team-b, :/export, fd00::1:/data, {SERVER}:export",
    f"{SERVER}:/",
    "files.example.com:/a,*",
    f"{SERVER}:/export/./team-b,{SERVER}:/export/team-b/x",
    f"\u00a0{SERVER}:{TEAM_A}\u3000,\u2003files.example.com\x85",  # white space as CEL's trim() knows it
    f"{SERVER}:{TEAM_A},bad\nentry",  # a refusal's message is one line, or the API server drops it
    ",".join(f"10.9.{i // 256}.{i % 256}:/export/x" for i in range(300)) + f",{SERVER}:{TEAM_A}",  # long
)
SHARES = (
    (SERVER, TEAM_A),
    (SERVER, f"{TEAM_A}/imagenet/train"),
    (SERVER, f"{TEAM_A}b"),
    (SERVER, TEAM_B),
    (SERVER, "/"),
    (SERVER, "/export/shared/x"),
    (SERVER, "/export/..team-b"),
    ("10.40.0.5", TEAM_A),
    ("files.example.com", "/x"),
    ("Files.Example.COM", "/a/b"),
    ("fd00::1", "/data/x"),
    ("FD00::1", "/data"),
)


def test_the_policy_and_the_operator_agree_on_every_list_and_share(
    cluster: TenantCluster, api_client: client.ApiClient, policy: list[dict[str, Any]], mark: str
) -> None:
    """Each list, set on a Namespace of its own (or left to the installer's), against each share in either
    field: the policy refuses exactly what dtjob.spec.nfs_shares refuses, and names the same list."""
    installer = cluster_shares({"DTJOB_NFS_SHARES": CLUSTER_LIST})
    namespaces = [cluster.tenant().namespace for _ in LISTS]
    for namespace, shares in zip(namespaces, LISTS, strict=True):
        mark_namespace(api_client, namespace, mark, shares)
    wait_judged(api_client, namespaces[0], job("probe", SERVER, TEAM_B))
    disagreements = []
    for namespace, shares in zip(namespaces, LISTS, strict=True):
        annotations = {"dtjob.io/nfs-shares": shares} if shares is not None else {}
        rule = namespace_shares(installer, namespace, annotations)
        for i, (server, path) in enumerate(SHARES):
            field = ("dataset", "checkpoints")[i % 2]
            operator_says = rule.refusal(server, path)
            policy_says = refusal(api_client, namespace, job(f"j{i}", server, path, field))
            if (operator_says is None) != (policy_says is None):
                disagreements.append(
                    f"{shares!r} {server}:{path}: operator {operator_says!r}, policy {policy_says!r}"
                )
            elif policy_says is not None:
                assert operator_says is not None and operator_says.split(" (allowed: ")[0] in policy_says
                assert rule.source in policy_says, policy_says
    assert not disagreements, "\n".join(disagreements)


def test_a_job_already_stored_stays_editable_and_deletable_when_its_namespaces_list_changes(
    tenant_a: Tenant, api_client: client.ApiClient, policy: list[dict[str, Any]], mark: str
) -> None:
    """A running job whose share the namespace's list no longer admits (the cluster admin narrowed it) can
    still be edited elsewhere and deleted, its finalizer taken off; naming another refused share is refused.
    A job another controller runs (MultiKueue's manager copy) is judged where it runs, not here."""
    mark_namespace(api_client, tenant_a.namespace, mark, None)
    editor = tenant_a.api()
    wait_judged(editor, tenant_a.namespace, job("probe", SERVER, TEAM_B))
    custom = client.CustomObjectsApi(editor)
    body = job("kept", SERVER, TEAM_A)
    body["metadata"]["finalizers"] = ["dtjob.io/test-hold"]
    created = custom.create_namespaced_custom_object(GROUP, VERSION, tenant_a.namespace, PLURAL, body)
    mark_namespace(api_client, tenant_a.namespace, mark, f"{SERVER}:/export/other")
    moved = job("probe2", SERVER, TEAM_A)
    wait_for(lambda: refusal(editor, tenant_a.namespace, moved) is not None, timeout=30, what="the new list")

    def patch(spec: dict[str, Any]) -> None:
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, tenant_a.namespace, PLURAL, "kept", {"spec": spec}
        )

    patch({"env": [{"name": "EPOCHS", "value": "3"}]})
    with pytest.raises(ApiException) as refused:
        patch({"dataset": {"volume": {"nfs": {"server": SERVER, "path": TEAM_B}}}})
    assert "spec.dataset.volume.nfs: NFS share" in json.loads(refused.value.body or "{}")["message"]
    custom.delete_namespaced_custom_object(GROUP, VERSION, tenant_a.namespace, PLURAL, "kept")
    admin = client.CustomObjectsApi(api_client)
    admin.patch_namespaced_custom_object(
        GROUP, VERSION, tenant_a.namespace, PLURAL, "kept", {"metadata": {"finalizers": None}}
    )
    wait_for(
        lambda: Jobs(api_client, tenant_a.namespace).get("kept") is None, timeout=30, what="kept deleted"
    )
    assert created["metadata"]["uid"]
    elsewhere = job("dispatched", SERVER, TEAM_B, managedBy="kueue.x-k8s.io/multikueue")
    assert refusal(editor, tenant_a.namespace, elsewhere) is None
