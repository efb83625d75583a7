"""Input that Kubernetes, the container runtime, a registry or the trainers would refuse later is refused by
the parser first, with the field named (the CRD refuses the same at apply: tests/integration/
test_operator_validation.py; the two are compared bound by bound in test_crd_contract.py)."""

from __future__ import annotations

from typing import Any

import pytest
from dtjob.spec.parse import SpecError
from dtjob.spec.run import MAX_DURATION_SECONDS

from tests.unit.operator_fixtures import job_spec

NFS = {"server": "files.example.net", "path": "/share"}
PVC = {"claimName": "imagenet"}
INT64_MAX = 2**63 - 1
STAGE = {"account": "acct1", "container": "datasets", "credentials": {"authMode": "workloadIdentity"}}


def imagenet(**volume: Any) -> dict[str, Any]:
    return {"source": "imagenet", "volume": {"persistentVolumeClaim": PVC, **volume}}


def nfs_data(**nfs: Any) -> dict[str, Any]:
    return {"source": "imagenet", "volume": {"nfs": {**NFS, **nfs}}}


def tolerations(*items: dict[str, Any]) -> dict[str, Any]:
    return {"tolerations": list(items)}


TOL = "spec.placement.tolerations[0]"
SEL = "spec.placement.nodeSelector"
RES = "spec.worker.resources"


BAD: list[tuple[dict[str, Any], str, str]] = [
    # Deadlines near int64's maximum overflowed the date arithmetic of every reconcile.
    ({"runPolicy": {"activeDeadlineSeconds": INT64_MAX}}, "spec.runPolicy.activeDeadlineSeconds", "<="),
    ({"runPolicy": {"ttlSecondsAfterFinished": INT64_MAX}}, "spec.runPolicy.ttlSecondsAfterFinished", "<="),
    # The node list answered 400 to these and the reconcile crashed in a loop.
    ({"placement": {"nodePool": "GPU pool"}}, "spec.placement.nodePool", "AKS node pool"),
    ({"placement": {"nodePool": "a" * 13}}, "spec.placement.nodePool", "AKS node pool"),
    ({"placement": {"launcher": {"nodePool": "sys_1"}}}, "spec.placement.launcher.nodePool", "node pool"),
    ({"placement": {"nodeSelector": {"zone": "west eu"}}}, f"{SEL}[zone]", "label value"),
    ({"placement": {"nodeSelector": {"bad key!": "x"}}}, f"{SEL}[bad key!]", "valid key"),
    ({"worker": {"podLabels": {"team": "a" * 64}}}, "spec.worker.podLabels[team]", "label value"),
    ({"worker": {"podLabels": {"-team": "ml"}}}, "spec.worker.podLabels[-team]", "valid key"),
    ({"worker": {"podLabels": {f"{'a' * 254}/x": "ml"}}}, f"spec.worker.podLabels[{'a' * 254}/x]", "prefix"),
    ({"worker": {"podAnnotations": {"a/b/c": "any text"}}}, "spec.worker.podAnnotations[a/b/c]", "key"),
    ({"launcher": {"podLabels": {"x": "-y"}}}, "spec.launcher.podLabels[x]", "label value"),
    ({"worker": {"podLabels": {f"k{i}": "v" for i in range(65)}}}, "spec.worker.podLabels", "at most 64"),
    ({"worker": {"resources": {"requests": {"cpu": "lots"}}}}, f"{RES}.requests[cpu]", "quantity"),
    ({"launcher": {"resources": {"limits": {"memory": "-1Gi"}}}}, "spec.launcher.resources.limits[memory]",
     "quantity"),
    ({"worker": {"resources": {"limits": {"nvidia gpu": 1}}}}, f"{RES}.limits[nvidia gpu]", "key"),
    ({"env": [{"name": "1ST"}]}, "spec.env[0].name", "environment variable"),
    ({"env": [{"name": "A=B", "value": "x"}]}, "spec.env[0].name", "environment variable"),
    ({"runPolicy": {"scheduling": {"queueName": "Team_Q"}}}, "spec.runPolicy.scheduling.queueName", "DNS"),
    ({"runPolicy": {"scheduling": {"podGroup": "g" * 64}}}, "spec.runPolicy.scheduling.podGroup", "DNS"),
    ({"runPolicy": {"scheduling": {"schedulerName": "My Sched"}}}, "spec.runPolicy.scheduling.schedulerName",
     "DNS"),
    ({"imagePullSecrets": [{"name": "ACR"}]}, "spec.imagePullSecrets[0].name", "DNS"),
    ({"image": "ghcr.io/Team/Trainer:1"}, "spec.image", "image reference"),
    ({"image": "trainer:"}, "spec.image", "image reference"),
    ({"image": "trainer:1 "}, "spec.image", "image reference"),
    ({"image": "https://ghcr.io/team/trainer"}, "spec.image", "image reference"),
    ({"dataset": imagenet(mountPath="data")}, "spec.dataset.volume.mountPath", "absolute"),
    ({"dataset": imagenet(mountPath="/data/")}, "spec.dataset.volume.mountPath", "trailing"),
    ({"dataset": imagenet(mountPath="/data/../etc")}, "spec.dataset.volume.mountPath", "'..'"),
    ({"dataset": imagenet(mountPath="/etc/mpi")}, "spec.dataset.volume.mountPath", "/etc/mpi"),
    ({"dataset": imagenet(mountPath="/etc")}, "spec.dataset.volume.mountPath", "/etc/dtjob"),
    ({"dataset": imagenet(mountPath="/dev/shm/data")}, "spec.dataset.volume.mountPath", "/dev/shm"),
    ({"dataset": imagenet(mountPath="/var/run/dtjob")}, "spec.dataset.volume.mountPath", "operator mounts"),
    ({"dataset": imagenet(mountPath="/dtjob/output")}, "spec.dataset.volume.mountPath", "/dtjob"),
    ({"checkpoints": {"nfs": NFS, "mountPath": "/proc/x"}}, "spec.checkpoints.mountPath", "/proc"),
    ({"dataset": imagenet(), "checkpoints": {"nfs": NFS, "mountPath": "/data"}}, "spec.checkpoints.mountPath",
     "mount path too"),
    ({"dataset": imagenet(mountPath="/checkpoints"), "checkpoints": {"persistentVolumeClaim": PVC}},
     "spec.checkpoints.mountPath", "mount path too"),
    ({"checkpoints": {"nfs": {**NFS, "readOnly": True}}}, "spec.checkpoints.nfs.readOnly", "rank 0 writes"),
    ({"checkpoints": {"persistentVolumeClaim": {"claimName": "c", "readOnly": True}}},
     "spec.checkpoints.persistentVolumeClaim.readOnly", "rank 0 writes"),
    ({"dataset": nfs_data(server="files.example.net:2049")}, "spec.dataset.volume.nfs.server", "host name"),
    ({"dataset": nfs_data(server="nfs://files")}, "spec.dataset.volume.nfs.server", "host name"),
    ({"dataset": nfs_data(path="share")}, "spec.dataset.volume.nfs.path", "absolute"),
    ({"dataset": nfs_data(path="/a/../b")}, "spec.dataset.volume.nfs.path", "'..'"),
    ({"checkpoints": {"nfs": {**NFS, "path": "/x//y"}}}, "spec.checkpoints.nfs.path", "empty"),
    ({"dataset": {"source": "imagenet", "volume": {"persistentVolumeClaim": {"claimName": "ImageNet"}}}},
     "spec.dataset.volume.persistentVolumeClaim.claimName", "DNS-1123 subdomain"),
    ({"checkpoints": {"persistentVolumeClaim": {"claimName": "c" * 254}}},
     "spec.checkpoints.persistentVolumeClaim.claimName", "DNS-1123 subdomain"),
    ({"placement": tolerations({"operator": "Equal", "value": "x"})}, f"{TOL}.operator", "key is empty"),
    ({"placement": tolerations({"key": "k", "operator": "Exists", "value": "x"})}, f"{TOL}.value", "Exists"),
    ({"placement": tolerations({"key": "k", "effect": "NoSchedule", "tolerationSeconds": 60})},
     f"{TOL}.tolerationSeconds", "NoExecute"),
    ({"placement": tolerations({"key": "bad key", "operator": "Exists"})}, f"{TOL}.key", "valid key"),
    ({"placement": tolerations({"key": "k", "value": "a b"})}, f"{TOL}.value", "label value"),
    ({"placement": {"launcher": {"tolerations": [{"key": "k", "operator": "Sometimes"}]}}},
     "spec.placement.launcher.tolerations[0].operator", "Exists or Equal"),
    ({"placement": tolerations(*[{"operator": "Exists"}] * 33)}, "spec.placement.tolerations", "at most 32"),
    ({"hyperparameters": {"seed": 2**32}}, "spec.hyperparameters.seed", "<= 4294967295"),
    ({"hyperparameters": {"labelSmoothing": 1}}, "spec.hyperparameters.labelSmoothing", "< 1"),
    ({"hyperparameters": {"labelSmoothing": 1.5}}, "spec.hyperparameters.labelSmoothing", "< 1"),
    ({"dataset": {**imagenet(), "dataDir": "/imagenet"}}, "spec.dataset.dataDir", "outside"),
    ({"dataset": {**imagenet(), "dataDir": "/data/x/"}}, "spec.dataset.dataDir", "trailing"),
    ({"dataset": {**imagenet(), "stageFrom": {**STAGE, "destination": "/scratch"}}},
     "spec.dataset.stageFrom.destination", "outside"),
    ({"dataset": {**imagenet(), "stageFrom": {**STAGE, "destination": "/data/./x"}}},
     "spec.dataset.stageFrom.destination", "'.'"),
    ({"dataset": {**imagenet(), "source": "synthetic", "stageFrom": STAGE}}, "spec.dataset.stageFrom",
     "imagenet"),
    ({"dataset": {**imagenet(), "stageFrom": {**STAGE, "prefix": "train/../../other-team"}}},
     "spec.dataset.stageFrom.prefix", "'..'"),
    ({"output": {**STAGE, "prefix": "a" * 769}}, "spec.output.prefix", "at most 768"),
    ({"output": {**STAGE, "prefix": "/".join(["a"] * 249)}}, "spec.output.prefix", "segments"),
    ({"dataset": {**imagenet(), "stageFrom": {**STAGE, "podAnnotations": {"bad key": "x"}}}},
     "spec.dataset.stageFrom.podAnnotations[bad key]", "valid key"),
]  # fmt: skip


@pytest.mark.parametrize(("changes", "path", "words"), BAD)
def test_bad_input_is_refused_naming_the_field(changes: dict[str, Any], path: str, words: str) -> None:
    with pytest.raises(SpecError) as info:
        job_spec(**changes)
    assert info.value.path == path, str(info.value)
    assert words in info.value.message, str(info.value)


GOOD: list[dict[str, Any]] = [
    {"runPolicy": {"activeDeadlineSeconds": MAX_DURATION_SECONDS,
                   "ttlSecondsAfterFinished": MAX_DURATION_SECONDS}},
    {"placement": {"nodePool": "gpua100", "nodeSelector": {"topology.kubernetes.io/zone": "westeurope-1"},
                   "launcher": {"nodePool": "system"}}},
    {"worker": {"podLabels": {"app.kubernetes.io/part-of": "", "team": "ml_research.v2"},
                "podAnnotations": {"prometheus.io/scrape": "true", "note": "free text, spaces: fine"}}},
    {"env": [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "my.setting-1", "value": "x"}]},
    {"image": "registry.example:5000/team/trainer:1.0-rc_1"},
    {"image": "trainer@sha256:" + "a" * 64},
    {"image": "ubuntu"},
    {"runPolicy": {"scheduling": {"queueName": "team-a", "podGroup": "rn50", "schedulerName": "sched.x"}}},
    {"dataset": imagenet(mountPath="/mnt/imagenet"), "checkpoints": {"nfs": NFS}},
    {"dataset": {**nfs_data(server="10.0.0.4", path="/"), "dataDir": "/data/x"}},
    {"checkpoints": {"nfs": {"server": "fd00::4", "path": "/exports/ckpt"}, "mountPath": "/home/dtjob/ckpt"}},
    {"placement": tolerations({"operator": "Exists"}, {"key": "spot", "operator": "Exists",
                                                       "effect": "NoExecute", "tolerationSeconds": 30})},
    {"hyperparameters": {"seed": 2**32 - 1, "labelSmoothing": 0.999}},
    {"dataset": {**imagenet(), "stageFrom": {**STAGE, "destination": "/data/in/", "prefix": "/ilsvrc/"}}},
    {"output": {**STAGE, "prefix": "a" * 768}},
]  # fmt: skip


@pytest.mark.parametrize("changes", GOOD)
def test_valid_input_still_parses(changes: dict[str, Any]) -> None:
    job_spec(**changes)
