"""A worker's node says it cannot keep it, as AKS's node problem detector says so: a node condition set True
(XIDErrors, GPUMissing, ... and VMEventScheduled ahead of maintenance), while the kubelet stays Ready, so
nothing else in Kubernetes moves the pod. A fixed world restarts on other nodes, not counted against
runPolicy.backoffLimit; an elastic world replaces the worker while the others train on. The conditions are
set on the simulated pool's nodes as the detector sets them: a strategic-merge patch of the node's status,
beside the kubelet's own conditions."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess

pytestmark = pytest.mark.integration

LONG_LAUNCHER = {"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}}
XID = "XID 79 (GPU has fallen off the bus) on GPU 00000001:00:00.0"


@pytest.fixture
def flag_node(core_v1: client.CoreV1Api) -> Iterator[Callable[[str, str, str], None]]:
    """Sets a condition True on a node (the node problem detector's part); taken off again after the test."""
    flagged: list[tuple[str, str]] = []

    def flag(node: str, kind: str, message: str) -> None:
        condition = {"type": kind, "status": "True", "reason": kind, "message": message}
        core_v1.patch_node_status(node, {"status": {"conditions": [condition]}})
        flagged.append((node, kind))

    yield flag
    for node, kind in flagged:
        core_v1.patch_node_status(node, {"status": {"conditions": [{"type": kind, "$patch": "delete"}]}})


def _node_of(jobs: Jobs, pod: str) -> str:
    return str(jobs.core.read_namespaced_pod(pod, jobs.ns).spec.node_name)


def _placed(jobs: Jobs, name: str, count: int, old: dict[str, str]) -> dict[str, Any] | None:
    """The live workers by name once `count` of them are bound, none of the `old` ones among them."""
    workers = {str(p.metadata.name): p for p in jobs.live_workers(name)}
    fresh = len(workers) == count and not {str(p.metadata.uid) for p in workers.values()} & set(old.values())
    return workers if fresh and all(p.spec.node_name for p in workers.values()) else None


def test_a_gpu_fault_restarts_a_fixed_world_on_other_nodes_without_spending_its_backoff_limit(
    jobs: Jobs, operator: OperatorProcess, flag_node: Callable[[str, str, str], None]
) -> None:
    jobs.create("xid", runPolicy={"backoffLimit": 0}, launcher=LONG_LAUNCHER)
    jobs.wait_phase("xid", "Running", timeout=120)
    old = {str(p.metadata.name): str(p.metadata.uid) for p in jobs.live_workers("xid")}
    sick = _node_of(jobs, "xid-worker-1")
    flag_node(sick, "XIDErrors", XID)

    wait_for(lambda: jobs.status("xid").get("restarts") == 1, timeout=90, what="the world restarted")
    restarting = jobs.condition("xid", "Restarting")
    assert restarting is not None and restarting["reason"] == "NodeUnhealthy"
    said = f"worker pod xid-worker-1's node {sick} reports XIDErrors: {XID}"
    assert restarting["message"] == f"{said}; restarting the world on other nodes (not counted against " \
        "runPolicy.backoffLimit)"  # fmt: skip
    assert jobs.wait_event("xid", "NodeUnhealthy").message == restarting["message"]

    # backoffLimit 0, and the job runs again: the restart was the node's.
    workers = wait_for(lambda: _placed(jobs, "xid", 2, old), timeout=120, what="a new world placed")
    assert sick not in {p.spec.node_name for p in workers.values()}
    for pod in workers.values():
        terms = pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
        assert [f.values for t in terms.node_selector_terms for f in t.match_fields] == [[sick]]
    status = jobs.wait_phase("xid", "Running", timeout=120)
    assert (status["restarts"], status["infrastructureRestarts"]) == (1, 1)
    counted = f'dtjob_node_problem_workers_total{{condition="XIDErrors",node="{sick}"}} 1.0'
    assert counted in operator.metrics_text()


def test_an_elastic_world_replaces_the_worker_of_a_node_that_lost_a_gpu(
    jobs: Jobs, operator: OperatorProcess, flag_node: Callable[[str, str, str], None]
) -> None:
    elastic = {"minWorkers": 2, "maxWorkers": 3}
    # A worker per node (4 GPUs each, as the pool's nodes have): one of them on the node that goes bad.
    jobs.create("spares", workers=3, gpusPerWorker=4, elastic=elastic, launcher=LONG_LAUNCHER)
    jobs.wait_phase("spares", "Running", timeout=120)
    old = {str(p.metadata.name): str(p.metadata.uid) for p in jobs.live_workers("spares")}
    sick = _node_of(jobs, "spares-worker-2")
    flag_node(sick, "GPUMissing", "expected 4 GPUs, found 3")

    def replaced() -> dict[str, Any] | None:
        workers = {str(p.metadata.name): p for p in jobs.live_workers("spares")}
        new = workers.get("spares-worker-2")
        bound = new is not None and new.metadata.uid != old["spares-worker-2"] and new.spec.node_name
        return workers if bound and len(workers) == 3 else None

    workers = wait_for(replaced, timeout=120, what="spares-worker-2 replaced on another node")
    assert workers["spares-worker-2"].spec.node_name != sick
    # The others trained on: same pods, no restart.
    assert {n: str(p.metadata.uid) for n, p in workers.items() if n != "spares-worker-2"} == {
        n: u for n, u in old.items() if n != "spares-worker-2"
    }
    status = jobs.status("spares")
    assert status["restarts"] == 0 and "infrastructureRestarts" not in status
    moved = jobs.wait_event("spares", "NodeUnhealthy").message
    assert moved == (
        f"worker pod spares-worker-2's node {sick} reports GPUMissing: expected 4 GPUs, found 3: "
        "replacing it on another node"
    )
