"""spec.checkpoints: rank 0's checkpoints on persistent storage, so a restarted world resumes."""

from __future__ import annotations

from typing import Any

import pytest
from dtjob import desired
from dtjob.desired.command import training_flags
from dtjob.spec.parse import SpecError

from tests.unit.operator_fixtures import job_spec

OWNER = {"apiVersion": "dtjob.io/v1alpha1", "kind": "DistributedTrainingJob", "name": "rn50", "uid": "uid-1"}
PVC = {"persistentVolumeClaim": {"claimName": "ckpt"}}


def mounts(pod: dict[str, Any]) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}


def volumes(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod["spec"]["volumes"]}


def flag(flags: list[str], name: str) -> str:
    return flags[flags.index(name) + 1]


def test_without_checkpoints_they_stay_in_the_pod() -> None:
    spec = job_spec()
    assert spec.checkpoints is None
    assert flag(training_flags(spec), "--checkpoint-dir") == "/dtjob/output/checkpoints"
    assert "checkpoints" not in volumes(desired.worker_pod(spec, OWNER, 0, 0))


def test_only_the_rank0_worker_mounts_the_checkpoint_claim() -> None:
    spec = job_spec(checkpoints=PVC)
    assert flag(training_flags(spec), "--checkpoint-dir") == "/checkpoints/ml/rn50"
    rank0, other = desired.worker_pod(spec, OWNER, 0, 0), desired.worker_pod(spec, OWNER, 1, 0)
    assert mounts(rank0)["checkpoints"] == "/checkpoints"
    assert volumes(rank0)["checkpoints"]["persistentVolumeClaim"] == {"claimName": "ckpt", "readOnly": False}
    # One pod only: a ReadWriteOnce claim works.
    assert "checkpoints" not in volumes(other)
    launcher = desired.launcher_pod(spec, OWNER, 0)
    assert "checkpoints" not in volumes(launcher)


def test_a_launcher_that_runs_ranks_holds_rank0_and_the_checkpoints() -> None:
    spec = job_spec(checkpoints={"nfs": {"server": "10.0.0.4", "path": "/ckpt"}, "mountPath": "/mnt/ckpt"},
                    launcher={"runAsWorker": True})  # fmt: skip
    launcher = desired.launcher_pod(spec, OWNER, 0)
    assert mounts(launcher)["checkpoints"] == "/mnt/ckpt"
    # Writable by default, unlike a dataset share.
    assert volumes(launcher)["checkpoints"]["nfs"] == {
        "server": "10.0.0.4",
        "path": "/ckpt",
        "readOnly": False,
    }
    assert "checkpoints" not in volumes(desired.worker_pod(spec, OWNER, 0, 0))
    assert flag(training_flags(spec), "--checkpoint-dir") == "/mnt/ckpt/ml/rn50"


@pytest.mark.parametrize(
    ("checkpoints", "path", "message"),
    [
        ({}, "spec.checkpoints", "must set nfs or persistentVolumeClaim"),
        ({**PVC, "nfs": {"server": "s", "path": "/p"}}, "spec.checkpoints", "not both"),
        ({**PVC, "mountPath": "relative"}, "spec.checkpoints.mountPath", "absolute path"),
        ({"persistentVolumeClaim": {}}, "spec.checkpoints.persistentVolumeClaim.claimName", "required"),
    ],
)
def test_bad_checkpoints_name_the_field(checkpoints: dict[str, Any], path: str, message: str) -> None:
    with pytest.raises(SpecError) as err:
        job_spec(checkpoints=checkpoints)
    assert err.value.path == path
    assert message in str(err.value)
