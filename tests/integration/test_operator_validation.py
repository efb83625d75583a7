"""Bad input is rejected by the CRD's schema and CEL rules at `kubectl apply`, with the field named."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from testbed.operator_harness import REPO, install_crd, kubectl

pytestmark = pytest.mark.integration


def manifest(name: str = "job", **spec: Any) -> str:
    body_spec: dict[str, Any] = {"framework": "pytorch", "workers": 2, "gpusPerWorker": 4}
    body_spec.update(spec)
    return yaml.safe_dump(
        {
            "apiVersion": "dtjob.io/v1alpha1",
            "kind": "DistributedTrainingJob",
            "metadata": {"name": name},
            "spec": body_spec,
        }
    )


@pytest.fixture
def crd(kubeconfig: str) -> str:
    install_crd(kubeconfig)
    return kubeconfig


CASES = [
    ({"workers": 0}, "spec.workers"),
    ({"workers": -3}, "spec.workers"),
    ({"framework": "mxnet"}, "spec.framework"),
    ({"gpusPerWorker": 9}, "spec.gpusPerWorker"),
    (
        {
            "dataset": {
                "volume": {
                    "nfs": {"server": "nfs", "path": "/x"},
                    "persistentVolumeClaim": {"claimName": "c"},
                }
            }
        },
        "set either nfs or persistentVolumeClaim, not both",
    ),
    (
        {"dataset": {"source": "imagenet"}},
        "spec.dataset.volume is required when spec.dataset.source is imagenet",
    ),
    ({"dataset": {"source": "imagenet", "volume": {"mountPath": "/d"}}}, "set nfs or persistentVolumeClaim"),
    ({"runPolicy": {"activeDeadlineSeconds": -1}}, "spec.runPolicy.activeDeadlineSeconds"),
    ({"runPolicy": {"ttlSecondsAfterFinished": -1}}, "spec.runPolicy.ttlSecondsAfterFinished"),
    ({"runPolicy": {"cleanPodPolicy": "Sometimes"}}, "spec.runPolicy.cleanPodPolicy"),
]

PVC = {"persistentVolumeClaim": {"claimName": "imagenet"}}
NFS = {"nfs": {"server": "files.example.net", "path": "/share"}}
STAGE = {"account": "acct1", "container": "datasets", "credentials": {"authMode": "workloadIdentity"}}
INT64_MAX = 2**63 - 1


def imagenet(**volume: Any) -> dict[str, Any]:
    return {"source": "imagenet", "volume": {**PVC, **volume}}


# Input that passed `kubectl apply` and failed later (a crash loop, a pod the API or kubelet refuses, a rank
# that exits): each is refused at apply now, the message naming the field. README: "Rejected at apply".
APPLY_REJECTS = [
    ({"runPolicy": {"activeDeadlineSeconds": INT64_MAX}}, "spec.runPolicy.activeDeadlineSeconds"),
    ({"runPolicy": {"ttlSecondsAfterFinished": INT64_MAX}}, "spec.runPolicy.ttlSecondsAfterFinished"),
    ({"placement": {"nodePool": "GPU pool"}}, "spec.placement.nodePool"),
    ({"placement": {"launcher": {"nodePool": "sys_1"}}}, "spec.placement.launcher.nodePool"),
    ({"placement": {"nodeSelector": {"zone": "west eu"}}}, "spec.placement.nodeSelector.zone"),
    ({"placement": {"nodeSelector": {"bad key!": "x"}}}, "spec.placement.nodeSelector: Invalid value"),
    ({"worker": {"podLabels": {"team": "a" * 64}}}, "spec.worker.podLabels.team"),
    ({"launcher": {"podAnnotations": {"a/b/c": "x"}}}, "keys must be qualified names"),
    ({"worker": {"podLabels": {"kueue.x-k8s.io/queue-name": "free"}}}, "spec.worker.podLabels: Forbidden"),
    ({"worker": {"podLabels": {f"k{i}": "v" for i in range(65)}}}, "spec.worker.podLabels: Too many"),
    ({"env": [{"name": "1ST", "value": "x"}]}, "spec.env[0].name"),
    ({"worker": {"resources": {"requests": {"cpu": "lots"}}}}, "spec.worker.resources.requests.cpu"),
    ({"runPolicy": {"scheduling": {"queueName": "Team_Queue"}}}, "spec.runPolicy.scheduling.queueName"),
    ({"runPolicy": {"scheduling": {"podGroup": "g" * 64}}}, "spec.runPolicy.scheduling.podGroup"),
    ({"runPolicy": {"scheduling": {"schedulerName": "My Sched"}}}, "spec.runPolicy.scheduling.schedulerName"),
    ({"runPolicy": {"scheduling": {"podGroup": "mine", "gang": {"scheduler": "volcano"}}}},
     "spec.runPolicy.scheduling.podGroup: Invalid value: \"object\": podGroup names a PodGroup of your own"),
    ({"runPolicy": {"scheduling": {"gang": {"scheduler": "coscheduling", "queue": "q"}}}},
     "spec.runPolicy.scheduling.gang.queue: Invalid value: \"object\": queue is a Volcano Queue"),
    ({"runPolicy": {"scheduling": {"gang": {"scheduler": "kueue"}}}},
     "spec.runPolicy.scheduling.gang.scheduler"),
    ({"runPolicy": {"scheduling": {"gang": {"scheduler": "volcano"}}},
      "worker": {"template": {"spec": {"schedulerName": "default-scheduler"}}}},
     "a pod template's spec.schedulerName cannot be set with spec.runPolicy.scheduling.gang"),
    ({"imagePullSecrets": [{"name": "ACR"}]}, "spec.imagePullSecrets[0].name"),
    ({"image": "ghcr.io/Team/Trainer:1"}, "spec.image"),
    ({"image": "trainer:"}, "spec.image"),
    ({"dataset": imagenet(mountPath="data")}, "spec.dataset.volume.mountPath"),
    ({"dataset": imagenet(mountPath="/data/../etc")}, "spec.dataset.volume.mountPath"),
    ({"dataset": imagenet(mountPath="/etc/mpi")}, "operator mounts itself"),
    ({"dataset": imagenet(mountPath="/etc")}, "operator mounts itself"),
    ({"dataset": imagenet(mountPath="/dev/shm")}, "spec.dataset.volume.mountPath"),
    ({"checkpoints": {**NFS, "mountPath": "/dtjob/output"}}, "spec.checkpoints.mountPath"),
    ({"dataset": imagenet(), "checkpoints": {**NFS, "mountPath": "/data"}},
     "spec.checkpoints.mountPath must differ from spec.dataset.volume.mountPath"),
    ({"checkpoints": {"nfs": {**NFS["nfs"], "readOnly": True}}}, "checkpoints.nfs.readOnly must be false"),
    ({"checkpoints": {"persistentVolumeClaim": {"claimName": "c", "readOnly": True}}},
     "spec.checkpoints.persistentVolumeClaim.readOnly must be false"),
    ({"dataset": {"source": "imagenet", "volume": {"nfs": {"server": "nfs://files", "path": "/share"}}}},
     "spec.dataset.volume.nfs.server"),
    ({"dataset": {"source": "imagenet", "volume": {"nfs": {"server": "files", "path": "share"}}}},
     "spec.dataset.volume.nfs.path"),
    ({"dataset": imagenet(persistentVolumeClaim={"claimName": "ImageNet"})},
     "spec.dataset.volume.persistentVolumeClaim.claimName"),
    ({"placement": {"tolerations": [{"operator": "Equal", "value": "x"}]}},
     "a toleration without key must use operator Exists"),
    ({"placement": {"tolerations": [{"key": "k", "operator": "Exists", "value": "x"}]}},
     "value must be empty with operator Exists"),
    ({"placement": {"tolerations": [{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 60}]}},
     "tolerationSeconds applies only to effect NoExecute"),
    ({"placement": {"launcher": {"tolerations": [{"key": "bad key", "operator": "Exists"}]}}},
     "spec.placement.launcher.tolerations[0].key"),
    ({"hyperparameters": {"seed": 2**32}}, "spec.hyperparameters.seed"),
    ({"hyperparameters": {"labelSmoothing": 1}}, "spec.hyperparameters.labelSmoothing"),
    ({"hyperparameters": {"xla": True}},
     "spec.hyperparameters.xla applies to frameworks tensorflow and keras"),
    ({"framework": "keras", "hyperparameters": {"dataLoader": "dali"}},
     "spec.hyperparameters.dataLoader dali applies to framework pytorch"),
    ({"framework": "tensorflow", "hyperparameters": {"compile": "max-autotune"}},
     "spec.hyperparameters.compile applies to framework pytorch"),
    ({"dataset": {**imagenet(), "dataDir": "/imagenet"}},
     "spec.dataset.dataDir must lie inside spec.dataset.volume.mountPath"),
    ({"dataset": {**imagenet(), "stageFrom": {**STAGE, "destination": "/scratch"}}},
     "spec.dataset.stageFrom.destination must lie inside spec.dataset.volume.mountPath"),
    ({"dataset": {**imagenet(), "source": "synthetic", "stageFrom": STAGE}},
     "spec.dataset.stageFrom applies only to spec.dataset.source imagenet"),
    ({"dataset": {**imagenet(), "stageFrom": {**STAGE, "prefix": "train/../../other-team"}}},
     "spec.dataset.stageFrom.prefix"),
    ({"output": {**STAGE, "prefix": "a" * 769}}, "spec.output.prefix"),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "expected"), APPLY_REJECTS)
def test_input_that_would_fail_later_is_refused_at_apply(
    crd: str, namespace: str, spec: dict[str, Any], expected: str
) -> None:
    done = kubectl(crd, "apply", "-n", namespace, "-f", "-", stdin=manifest(**spec))
    assert done.returncode != 0, f"accepted: {spec}"
    assert expected in done.stderr, done.stderr


@pytest.mark.parametrize(("spec", "expected"), CASES)
def test_schema_rejects_bad_spec(crd: str, namespace: str, spec: dict[str, Any], expected: str) -> None:
    done = kubectl(crd, "apply", "-n", namespace, "-f", "-", stdin=manifest(**spec))
    assert done.returncode != 0
    assert expected in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("name", "expected"),
    [("x" * 46, "at most 45 characters"), ("9lives", "DNS-1035 label"), ("Bad-Name", "metadata.name")],
)
def test_schema_rejects_bad_names(crd: str, namespace: str, name: str, expected: str) -> None:
    done = kubectl(crd, "apply", "-n", namespace, "-f", "-", stdin=manifest(name=name))
    assert done.returncode != 0
    assert expected in done.stderr, done.stderr


def test_examples_are_accepted(crd: str, namespace: str) -> None:
    for path in sorted((REPO / "examples").glob("*.yaml")):
        done = kubectl(crd, "apply", "--dry-run=server", "-n", namespace, "-f", str(path))
        assert done.returncode == 0, f"{path.name}: {done.stderr}"


def test_no_defaults_are_written_into_spec(crd: str, namespace: str) -> None:
    done = kubectl(crd, "apply", "-n", namespace, "-f", "-", "-o", "json", stdin=manifest(name="plain"))
    assert done.returncode == 0, done.stderr
    stored = yaml.safe_load(done.stdout)
    assert stored["spec"] == {"framework": "pytorch", "workers": 2, "gpusPerWorker": 4}


def test_kubectl_explain_documents_fields(crd: str) -> None:
    def explained(field: str) -> str:
        # Discovery may lag the CRD by a few seconds.
        from testbed.kube_wait import wait_for

        return wait_for(
            lambda: (lambda r: r.stdout if r.returncode == 0 else None)(kubectl(crd, "explain", field)),
            timeout=30,
            what=f"kubectl explain {field}",
        )

    # kubectl wraps descriptions: compare with the whitespace folded.
    assert "0 makes a CPU job" in " ".join(explained("dtj.spec.gpusPerWorker").split())
    assert "MPI ranks per worker" in " ".join(explained("dtj.spec.slotsPerWorker").split())
    assert "cleanPodPolicy" in explained("dtjob.spec.runPolicy")
    # Status, and a field inside a list of a schema the YAML shares between two places.
    assert "a Kueue preemption is not one" in " ".join(explained("dtj.status.restarts").split())
    assert "count against runPolicy.backoffLimit" in " ".join(
        explained("dtj.status.infrastructureRestarts").split()
    )
    tolerance = explained("dtj.spec.placement.launcher.tolerations.tolerationSeconds")
    assert "Effect NoExecute only" in " ".join(tolerance.split())


def test_printer_columns(crd: str, namespace: str) -> None:
    done = kubectl(crd, "apply", "-n", namespace, "-f", "-", stdin=manifest(name="cols"))
    assert done.returncode == 0, done.stderr
    header = kubectl(crd, "get", "dtj", "-n", namespace).stdout.splitlines()[0].split()
    assert header == ["NAME", "PHASE", "WORKERS", "GPUS", "FRAMEWORK", "RESTARTS", "RANKS", "AGE"]
    assert "PERCENT" not in header and "ETA" not in header  # priority 1: -o wide only
    wide = kubectl(crd, "get", "dtj", "-n", namespace, "-o", "wide").stdout.splitlines()[0].split()
    assert wide[7:] == ["PROGRESS", "PERCENT", "ETA", "MESSAGE", "AGE"]
