"""The operator watches pods, batch Jobs and EndpointSlices by labels anyone who may make them can set, so a
namespace admin decides how large the objects it is handed are: up to the API server's 1.5 MiB, in labels,
finalizers and scheduling gates that no limit counts (a gated pod never runs, and costs no quota of GPUs).
The operator serves every tenant: it must keep of each what it reads, not the whole object."""

from __future__ import annotations

import time
from typing import Any

from dtjob import names

from testbed.kube_wait import wait_for
from testbed.operator_harness import OperatorProcess
from testbed.tenancy import ADMIN, Tenant
from tests.security.process_memory import peak_growth, peak_resident, resident

PODS = 40
LABELS_A_POD = 6_000  # about 1 MB of labels
CONTAINERS_A_POD = 1_500  # the kubelet (here kwok) writes a status for each


def padded_pod(name: str) -> Any:
    labels = {f"pad.example.com/l{i:05d}": "v" * 63 for i in range(LABELS_A_POD)}
    labels.update(names.labels("padded", "worker", names.ROLE_WORKER))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "finalizers": [f"example.com/f{i}" for i in range(500)]},
        "spec": {
            "schedulingGates": [{"name": f"example.com/hold-{i}"} for i in range(500)],
            "containers": [{"name": "c", "image": "busybox"}],
        },
    }


def make_padded_pods(tenant: Tenant) -> None:
    for i in range(PODS):
        tenant.core(ADMIN).create_namespaced_pod(tenant.namespace, padded_pod(f"padded-{i}"))


def remove_padded_pods(tenant: Tenant) -> None:
    core = tenant.core(ADMIN)
    for i in range(PODS):  # finalizers: each pod stays until they are off
        core.patch_namespaced_pod(f"padded-{i}", tenant.namespace, {"metadata": {"finalizers": None}})
    core.delete_collection_namespaced_pod(tenant.namespace)


def test_gated_pods_with_the_watchs_labels_and_a_megabyte_of_their_own_cannot_fill_the_operators_memory(
    tenant_b: Tenant, operator: OperatorProcess
) -> None:
    """Tenant B's admin makes 40 gated pods labelled as a job's workers, each with 1 MB of labels of its
    own. Kept whole, each is a few MB of Python objects in the operator (a few hundred: past its memory limit,
    and again at every start, from the LIST)."""
    assert operator.proc is not None
    pid = operator.proc.pid
    before = resident(pid)
    try:
        make_padded_pods(tenant_b)
        grown = peak_growth(pid, before, 20)
        assert grown < 20_000_000, f"the operator grew by {grown / 1e6:.0f} MB"
        assert operator.proc.poll() is None
    finally:
        remove_padded_pods(tenant_b)


def started_peak(operator: OperatorProcess) -> int:
    """The operator started again: its peak resident memory over its first 15 s, which hold its first LISTs
    of the children."""
    operator.stop()
    operator.start()
    if operator.leader_elect:
        wait_for(operator.leading, timeout=60, what="the operator leading again")
    time.sleep(15)
    assert operator.proc is not None and operator.proc.poll() is None
    return peak_resident(operator.proc.pid)


def test_an_operator_that_starts_beside_such_pods_lists_them_without_decoding_them_all_at_once(
    tenant_b: Tenant, operator: OperatorProcess
) -> None:
    """A LIST page is decoded whole before each item is cut: the 40 padded pods in one page of 250 are 45 MB
    of JSON, several times that as Python objects, at each start and each resync (+208 MB at the start; +159
    MB in pages of 25). A page past a bound in bytes comes again smaller (+27 MB)."""
    alone = started_peak(operator)
    try:
        make_padded_pods(tenant_b)
        beside = started_peak(operator)
        grown = beside - alone
        assert grown < 60_000_000, f"started beside them, it peaked {grown / 1e6:.0f} MB higher"
    finally:
        remove_padded_pods(tenant_b)


def crowded_pod(name: str) -> Any:
    """A running pod labelled as a job's worker, with as many containers as its spec lists: each meets the
    `restricted` Pod Security level, and each gets a status of its own."""
    restricted = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    containers = [
        {"name": f"c{i}", "image": "busybox", "securityContext": restricted} for i in range(CONTAINERS_A_POD)
    ]
    pod_security = {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": names.labels("crowded", "worker", names.ROLE_WORKER)},
        "spec": {
            "nodeSelector": {"type": "kwok"},
            "tolerations": [{"operator": "Exists"}],
            "securityContext": pod_security,
            "containers": containers,
        },
    }


def statuses_written(tenant: Tenant) -> bool:
    pods = tenant.core(ADMIN).list_namespaced_pod(
        tenant.namespace, label_selector="dtjob.io/job-name=crowded"
    )
    return len(pods.items) == PODS and all(
        len(pod.status.container_statuses or ()) == CONTAINERS_A_POD for pod in pods.items
    )


def test_running_pods_with_the_watchs_labels_and_a_thousand_containers_cannot_fill_the_operators_memory(
    tenant_b: Tenant, operator: OperatorProcess
) -> None:
    """Tenant B's admin runs 40 pods labelled as a job's workers, each with 1,500 containers, whose statuses
    the kubelet writes (each pod's watch event is about 1 MB). Of each list of statuses the operator keeps
    what pod_state reads, a few entries, where it kept all 1,500: it peaked 114 MB higher then, 50 to 58 MB
    now (40 pods of one container: nothing). The children's cache alone holds about 1 MB of them now, 54 MB
    before: the rest is not kept by it."""
    assert operator.proc is not None
    pid = operator.proc.pid
    before = resident(pid)
    core = tenant_b.core(ADMIN)
    try:
        for i in range(PODS):
            core.create_namespaced_pod(tenant_b.namespace, crowded_pod(f"crowded-{i}"))
        wait_for(lambda: statuses_written(tenant_b), timeout=180, what="every container's status written")
        grown = peak_growth(pid, before, 20)
        assert grown < 80_000_000, f"the operator grew by {grown / 1e6:.0f} MB"
        assert operator.proc.poll() is None
    finally:
        core.delete_collection_namespaced_pod(tenant_b.namespace, grace_period_seconds=0)
