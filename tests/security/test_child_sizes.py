"""The operator watches pods, batch Jobs and EndpointSlices by labels anyone who may make them can set, so a
namespace admin decides how large the objects it is handed are: up to the API server's 1.5 MiB, in labels,
finalizers and scheduling gates that no limit counts (a gated pod never runs, and costs no quota of GPUs).
The operator serves every tenant: it must keep of each what it reads, not the whole object."""

from __future__ import annotations

from typing import Any

from dtjob import names

from testbed.operator_harness import OperatorProcess
from testbed.tenancy import ADMIN, Tenant
from tests.security.process_memory import peak_growth, resident

PODS = 40
LABELS_A_POD = 6_000  # about 1 MB of labels


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


def test_gated_pods_with_the_watchs_labels_and_a_megabyte_of_their_own_cannot_fill_the_operators_memory(
    tenant_b: Tenant, operator: OperatorProcess
) -> None:
    """Tenant B's admin makes 40 gated pods labelled as a job's workers, each with 1 MB of labels of its
    own. Kept whole, each is a few MB of Python objects in the operator (a few hundred: past its memory limit,
    and again at every start, from the LIST)."""
    assert operator.proc is not None
    pid, namespace = operator.proc.pid, tenant_b.namespace
    core = tenant_b.core(ADMIN)
    before = resident(pid)
    try:
        for i in range(PODS):
            core.create_namespaced_pod(namespace, padded_pod(f"padded-{i}"))
        grown = peak_growth(pid, before, 20)
        assert grown < 20_000_000, f"the operator grew by {grown / 1e6:.0f} MB"
        assert operator.proc.poll() is None
    finally:
        for i in range(PODS):  # finalizers: each pod stays until they are off
            core.patch_namespaced_pod(f"padded-{i}", namespace, {"metadata": {"finalizers": None}})
        core.delete_collection_namespaced_pod(namespace)
