"""`hack/cluster.sh up` is idempotent and `down` leaves no process behind (a second, small cluster); with
SIM_MANY_PODS=1 (the benchmarks' kwok, hack/kwok/many-pods.yaml) its pods still run."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from testbed.kube_wait import wait_for
from testbed.processes import processes_of
from tests.tools import REPO

pytestmark = pytest.mark.integration
CLUSTER = "dtjob-lifecycle"


def cluster(*args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CLUSTER_NAME": CLUSTER, "SYSTEM_POOL_SIZE": "1", "GPU_POOL_SIZE": "1", **extra_env}
    return subprocess.run(
        [str(REPO / "hack" / "cluster.sh"), *args], env=env, capture_output=True, text=True, timeout=240
    )


@pytest.fixture
def lifecycle_cluster(local_control_plane: Path) -> Iterator[Path]:
    workdir = local_control_plane.parent / CLUSTER
    try:
        yield workdir
    finally:
        cluster("down")


def test_up_twice_then_down_leaves_nothing_running(lifecycle_cluster: Path) -> None:
    first = cluster("up")
    assert first.returncode == 0, first.stderr
    pids = set(processes_of(lifecycle_cluster))
    assert len(pids) >= 5, "etcd, kube-apiserver, controller-manager, scheduler and kwok should be running"

    second = cluster("up")
    assert second.returncode == 0, second.stderr
    assert "already running" in second.stderr
    assert set(processes_of(lifecycle_cluster)) == pids, "a second `up` must not restart anything"
    status = cluster("status")
    assert status.stdout.count("aks-gpu-") == 1 and status.stdout.count("aks-system-") == 1

    down = cluster("down")
    assert down.returncode == 0, down.stderr
    assert processes_of(lifecycle_cluster) == {}
    assert cluster("status").returncode != 0


def test_with_many_pods_kwok_still_runs_pods(lifecycle_cluster: Path) -> None:
    """A KwokConfiguration handed to kwokctl replaces kwok's defaults: one that set only the pods'
    parallelism left the node leases' at 0, and kwok exited at its start."""
    up = cluster("up", SIM_MANY_PODS="1")
    assert up.returncode == 0, up.stderr
    kubeconfig = cluster("kubeconfig").stdout.strip()
    core = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
    node = core.list_node(label_selector="kubernetes.azure.com/agentpool=system").items[0].metadata.name
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="played"),
        spec=client.V1PodSpec(node_name=node, containers=[client.V1Container(name="c", image="none")]),
    )
    core.create_namespaced_pod("default", pod)

    def running() -> bool:
        return core.read_namespaced_pod("played", "default").status.phase == "Running"

    wait_for(running, timeout=60, interval=0.5, what="the pod Running on a simulated node")
