"""spec.checkpoints against the real API server: the claim is waited for, mounted on rank 0's pod of every
world attempt (so a restart resumes from the same place), and bad shapes are rejected at apply."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess

pytestmark = pytest.mark.integration
CLAIM = {"persistentVolumeClaim": {"claimName": "ckpt"}}
LONG_LAUNCHER = {"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}}


@pytest.fixture
def bound_claim(jobs: Jobs) -> Iterator[Any]:
    """A claim statically bound to its own PersistentVolume (the real PV controller binds them)."""
    pv_name = f"ckpt-{uuid.uuid4().hex[:8]}"
    volume: Any = {
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": "10Gi"},
            "accessModes": ["ReadWriteOnce"],
            "hostPath": {"path": f"/simulated/{pv_name}"},
            "claimRef": {"namespace": jobs.ns, "name": "ckpt"},
            "storageClassName": "",
        },
    }
    claim: Any = {
        "metadata": {"name": "ckpt"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "10Gi"}},
            "volumeName": pv_name,
            "storageClassName": "",
        },
    }
    jobs.core.create_persistent_volume(volume)
    try:
        yield claim
    finally:
        jobs.core.delete_persistent_volume(pv_name)


def checkpoint_mounts(pod: client.V1Pod) -> list[str]:
    return [m.mount_path for m in pod.spec.containers[0].volume_mounts if m.name == "checkpoints"]


def test_restarted_world_mounts_the_same_checkpoints(
    jobs: Jobs, operator: OperatorProcess, bound_claim: Any
) -> None:
    jobs.create("resumer", checkpoints=CLAIM, launcher=LONG_LAUNCHER, runPolicy={"backoffLimit": 2})
    # No claim yet: the job waits, naming the field, and creates nothing.
    wait_for(lambda: jobs.condition("resumer", "Created"), timeout=60, what="Created condition")
    cond = jobs.condition("resumer", "Created")
    assert cond and cond["reason"] == "PVCNotFound"
    assert cond["message"].startswith("spec.checkpoints.persistentVolumeClaim.claimName")
    assert not jobs.pods("resumer")

    jobs.core.create_namespaced_persistent_volume_claim(jobs.ns, bound_claim)
    jobs.wait_phase("resumer", "Running", timeout=120)
    workers = {p.metadata.name: p for p in jobs.live_workers("resumer")}
    assert checkpoint_mounts(workers["resumer-worker-0"]) == ["/checkpoints"]
    assert checkpoint_mounts(workers["resumer-worker-1"]) == []
    launcher = jobs.launcher("resumer")
    assert "--checkpoint-dir /checkpoints/" + jobs.ns + "/resumer" in launcher.spec.containers[0].command[2]

    # A worker dies: the whole world restarts, and rank 0 of the new world finds the same checkpoints.
    jobs.annotate_pod("resumer-worker-1", {"sim.dtjob.io/outcome": "Failed"})
    wait_for(lambda: jobs.status("resumer").get("restarts") == 1, timeout=90, what="a world restart")
    jobs.wait_phase("resumer", "Running", timeout=120)
    rank0 = next(p for p in jobs.live_workers("resumer") if p.metadata.name == "resumer-worker-0")
    assert rank0.metadata.labels["dtjob.io/attempt"] == "1"
    assert checkpoint_mounts(rank0) == ["/checkpoints"]
    claim = next(v for v in rank0.spec.volumes if v.name == "checkpoints").persistent_volume_claim
    assert claim.claim_name == "ckpt"


@pytest.mark.parametrize(
    ("checkpoints", "message"),
    [
        ({}, "spec.checkpoints: set nfs or persistentVolumeClaim"),
        (
            {**CLAIM, "nfs": {"server": "s", "path": "/p"}},
            "spec.checkpoints: set either nfs or persistentVolumeClaim",
        ),
    ],
)
def test_bad_checkpoints_are_rejected_at_apply(jobs: Jobs, checkpoints: dict[str, Any], message: str) -> None:
    with pytest.raises(ApiException) as err:
        jobs.create("bad-ckpt", checkpoints=checkpoints)
    assert err.value.status == 422
    assert message in str(err.value.body)
