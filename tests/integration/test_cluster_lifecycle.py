"""`hack/cluster.sh up` is idempotent and `down` leaves no process behind (a second, small cluster)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.processes import processes_of
from tests.tools import REPO

pytestmark = pytest.mark.integration
CLUSTER = "dtjob-lifecycle"


def cluster(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CLUSTER_NAME": CLUSTER, "SYSTEM_POOL_SIZE": "1", "GPU_POOL_SIZE": "1"}
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
