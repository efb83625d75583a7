"""A GPU fault reported on the real node's Node, as AKS's node problem detector reports one (XIDErrors set
True beside the kubelet's own conditions, which the kubelet keeps): the world restarts off the node, not
counted against backoffLimit; the real scheduler keeps the new workers off it (the pool has no other GPU
node, so they wait, unschedulable); once the condition clears, the operator makes them again without the
exclusion and the world runs on the node."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from testbed.azurite import Azurite
from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess
from tests.e2e.conftest import RealCluster
from tests.e2e.real_jobs import create_tiny_job, new_container, tiny_model, tiny_training

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

FAULT = "XID 48 (double bit ECC error) on GPU 00000001:00:00.0"


@pytest.fixture
def core(real_cluster: RealCluster) -> Iterator[client.CoreV1Api]:
    api = client.CoreV1Api(real_cluster.api)
    yield api
    for node in api.list_node().items:  # the node as it was, whatever the test left
        if any(c.type == "XIDErrors" for c in node.status.conditions or []):
            _set_fault(api, str(node.metadata.name), None)


def _set_fault(core: client.CoreV1Api, node: str, message: str | None) -> None:
    condition = {"type": "XIDErrors", "$patch": "delete"}
    if message is not None:
        condition = {"type": "XIDErrors", "status": "True", "reason": "XIDErrors", "message": message}
    core.patch_node_status(node, {"status": {"conditions": [condition]}})


def _unschedulable(jobs: Jobs, name: str, count: int) -> list[str] | None:
    """The scheduler's word on each live worker it could not place, once it said so of `count` of them."""
    said = [
        str(c.message)
        for pod in jobs.live_workers(name)
        for c in pod.status.conditions or []
        if c.type == "PodScheduled" and c.status == "False"
    ]
    return said if len(said) == count else None


def test_a_gpu_fault_on_the_node_moves_the_world_until_the_node_recovers(
    real_jobs: Jobs, real_operator: OperatorProcess, node_azurite: Azurite, core: client.CoreV1Api
) -> None:
    name = "xid"
    # resnet-tiny, with steps enough that the first world is still training when the fault is reported.
    create_tiny_job(
        real_jobs, name, node_azurite, new_container(node_azurite),
        hyperparameters=tiny_training(stepsPerEpoch=400), **tiny_model(),
    )  # fmt: skip
    ready = wait_for(lambda: [p for p in real_jobs.live_workers(name) if p.status.pod_ip and any(
        c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])], timeout=240,
        what="a worker Ready")  # fmt: skip
    node = str(ready[0].spec.node_name)
    _set_fault(core, node, FAULT)

    wait_for(lambda: real_jobs.status(name).get("restarts") == 1, timeout=120, what="the world restarted")
    restarting = real_jobs.condition(name, "Restarting")
    assert restarting is not None and restarting["reason"] == "NodeUnhealthy"
    assert (
        f"'s node {node} reports XIDErrors: {FAULT}; restarting the world on other nodes"
        in (restarting["message"])
    )
    # No other GPU node: the real scheduler leaves the new workers unplaced, by their affinity.
    verdicts = wait_for(
        lambda: _unschedulable(real_jobs, name, 2), timeout=120, what="the new workers unschedulable"
    )
    assert all("affinity" in v for v in verdicts), verdicts
    assert real_jobs.status(name)["infrastructureRestarts"] == 1

    # The node recovers: the waiting workers are made again, placed on it, and the world runs.
    _set_fault(core, node, None)
    status = real_jobs.wait_phase(name, "Running", "Succeeded", "Failed", timeout=240)
    assert status["phase"] in ("Running", "Succeeded"), status
    assert (status["restarts"], status["infrastructureRestarts"]) == (1, 1)
    assert {p.spec.node_name for p in real_jobs.live_workers(name)} <= {node}
