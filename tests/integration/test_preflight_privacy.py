"""The GPU preflight speaks only of the job's own pool: a job that asks for more GPUs per worker than its pool
offers fails with what its pool has, never with the labels, names or GPU counts of another tenant's nodes
(nodes its affinity excludes, or whose taints it does not tolerate)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import replace
from functools import partial

import pytest
from dtjob.kube.client import KubeClient
from dtjob.kube.connect import ApiClient
from dtjob.reconcile.preflight import preflight
from kubernetes import client

from testbed.kube_wait import wait_for
from tests.unit.operator_fixtures import job_spec

pytestmark = pytest.mark.integration

POOL_LABEL = "dtjob.io/test-pool"


@pytest.fixture
def pools(core_v1: client.CoreV1Api) -> Iterator[str]:
    """Three plain Node objects (no kubelet): this tenant's pool of 2-GPU nodes, another tenant's 8-GPU pool,
    and an 8-GPU node of the same shared label kept for another tenant by a NoSchedule taint."""
    run = uuid.uuid4().hex[:8]
    nodes = [
        (f"mine-{run}", {POOL_LABEL: f"mine-{run}", "shared": run}, 2, []),
        (f"secret-tenant-{run}", {POOL_LABEL: f"secret-tenant-{run}", "tenant": "secret-b"}, 8, []),
        (
            f"tainted-{run}",
            {POOL_LABEL: f"tainted-{run}", "shared": run, "tenant": "secret-c"},
            8,
            [client.V1Taint(key="tenant", value="secret-c", effect="NoSchedule")],
        ),
    ]

    def has_gpus(name: str, gpus: int) -> bool:
        """Set the node's GPUs until they stay: the node controllers write the status of a node with no
        kubelet too, and a write of theirs may replace the first one of ours."""
        if (core_v1.read_node(name).status.allocatable or {}).get("nvidia.com/gpu") == str(gpus):
            return True
        resources = {"nvidia.com/gpu": str(gpus)}
        core_v1.patch_node_status(name, {"status": {"capacity": resources, "allocatable": resources}})
        return False

    try:
        for name, labels, _, taints in nodes:
            core_v1.create_node(
                client.V1Node(
                    metadata=client.V1ObjectMeta(name=name, labels=labels),
                    spec=client.V1NodeSpec(taints=taints or None),
                )
            )
        for name, _, gpus, _ in nodes:
            wait_for(partial(has_gpus, name, gpus), timeout=30, what=f"node {name}'s GPUs")
        yield run
    finally:
        for name, *_ in nodes:
            with contextlib.suppress(client.ApiException):
                core_v1.delete_node(name)


def assert_tells_only_of_own_pool(message: str, run: str) -> None:
    assert "have at most 2 nvidia.com/gpu" in message, message
    for secret in ("8 nvidia.com/gpu", "secret", f"tainted-{run}", POOL_LABEL):
        assert secret not in message, message


def test_a_job_placed_by_affinity_hears_only_of_its_own_pool(operator_api: ApiClient, pools: str) -> None:
    spec = job_spec(gpusPerWorker=4)
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": [f"mine-{pools}"]}]}
                ]
            }
        }
    }
    spec = replace(spec, placement=replace(spec.placement, node_selector={}, affinity=affinity))
    blocker = preflight(KubeClient(operator_api), spec)
    assert blocker is not None and blocker.fatal and blocker.reason == "InsufficientGPUsPerNode"
    assert_tells_only_of_own_pool(blocker.message, pools)
    assert "spec.placement.affinity" in blocker.message


def test_nodes_kept_by_a_taint_the_job_does_not_tolerate_are_not_its_pool(
    operator_api: ApiClient, pools: str
) -> None:
    spec = job_spec(gpusPerWorker=4)
    spec = replace(spec, placement=replace(spec.placement, node_selector={"shared": pools}))
    blocker = preflight(KubeClient(operator_api), spec)
    assert blocker is not None and blocker.fatal and blocker.reason == "InsufficientGPUsPerNode"
    assert_tells_only_of_own_pool(blocker.message, pools)
    assert f"shared={pools}" in blocker.message  # the job's own selector is its own business

    tolerating = replace(
        spec,
        placement=replace(
            spec.placement,
            tolerations=(*spec.placement.tolerations, {"key": "tenant", "operator": "Exists"}),
        ),
    )
    assert preflight(KubeClient(operator_api), tolerating) is None  # a node it may use has 8
