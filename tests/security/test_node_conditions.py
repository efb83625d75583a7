"""The operator moves a job's workers off a node whose conditions say it cannot keep them (a GPU fault, a VM
event ahead). A tenant who could set such a condition could restart or move another team's world at will;
with the chart's roles a tenant, its namespace admin included, can neither write a Node's status nor its
labels, and another team's world keeps running while the tenant tries."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from kubernetes import client

from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess
from testbed.tenancy import ADMIN, EDITOR, Tenant, refused

LONG_LAUNCHER = {"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}}


def test_a_tenant_cannot_flag_a_node_to_move_another_teams_workers(
    tenant_a: Tenant, tenant_b: Tenant, operator: OperatorProcess, api_client: client.ApiClient
) -> None:
    tenant_b.jobs().create("theirs", launcher=LONG_LAUNCHER)
    theirs = Jobs(api_client, tenant_b.namespace)  # read as the cluster admin: an editor lists no pods
    theirs.wait_phase("theirs", "Running", timeout=120)
    before = {str(p.metadata.name): str(p.metadata.uid) for p in theirs.live_workers("theirs")}
    node = str(theirs.core.read_namespaced_pod("theirs-worker-1", tenant_b.namespace).spec.node_name)

    xid = {"type": "XIDErrors", "status": "True", "reason": "x", "message": "x"}
    fault = {"status": {"conditions": [xid]}}
    flagged = client.CoreV1Api(api_client).read_node_status(node)
    flagged.status.conditions.append(client.V1NodeCondition(type="GPUMissing", status="True"))
    sick = {"metadata": {"labels": {"sick": "true"}}}
    for role in (EDITOR, ADMIN):
        core = tenant_a.core(role)
        attempts: list[Callable[[], Any]] = [
            partial(core.patch_node_status, node, fault),
            partial(core.replace_node_status, node, flagged),
            partial(core.patch_node, node, sick),
        ]
        assert all(refused(attempt) for attempt in attempts), f"{role} wrote a node"

    # The other team's world was not touched: the operator looked at it again, and it runs as it did.
    seen = operator.reconciles()
    wait_for(lambda: operator.reconciles() >= seen + 2, timeout=90, what="two more reconciles")
    status = theirs.status("theirs")
    assert status["phase"] == "Running" and status["restarts"] == 0
    assert {str(p.metadata.name): str(p.metadata.uid) for p in theirs.live_workers("theirs")} == before
    conditions = client.CoreV1Api(api_client).read_node_status(node).status.conditions or []
    assert not any(c.type in ("XIDErrors", "GPUMissing") for c in conditions)


def test_a_tenants_own_avoided_nodes_annotation_never_reaches_its_workers(
    tenant_a: Tenant, operator: OperatorProcess, api_client: client.ApiClient
) -> None:
    """dtjob.io/avoided-nodes says which nodes the operator kept a worker off; an unplaced worker whose
    nodes have all recovered is made again. Set by the job itself (naming a node never flagged), it would
    have the operator delete and create that worker at every reconcile."""
    forged = {"dtjob.io/avoided-nodes": "aks-gpu-31415926-vmss000000"}
    tenant_a.jobs().create(
        "forged", launcher=LONG_LAUNCHER,
        worker={"podAnnotations": forged, "template": {"metadata": {"annotations": forged}}},
    )  # fmt: skip
    mine = Jobs(api_client, tenant_a.namespace)
    mine.wait_phase("forged", "Running", timeout=120)
    workers = {str(p.metadata.name): p for p in mine.live_workers("forged")}
    assert len(workers) == 2
    assert not any("dtjob.io/avoided-nodes" in (p.metadata.annotations or {}) for p in workers.values())
    seen = operator.reconciles()
    wait_for(lambda: operator.reconciles() >= seen + 2, timeout=90, what="two more reconciles")
    again = {str(p.metadata.name): str(p.metadata.uid) for p in mine.live_workers("forged")}
    assert again == {n: str(p.metadata.uid) for n, p in workers.items()}
    assert mine.status("forged")["restarts"] == 0
