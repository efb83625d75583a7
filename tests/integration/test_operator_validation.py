"""Bad input is rejected by the CRD's schema and CEL rules at `kubectl apply`, with the field named."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.integration.operator_harness import REPO, install_crd, kubectl

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
        from tests.kube_wait import wait_for

        return wait_for(
            lambda: (lambda r: r.stdout if r.returncode == 0 else None)(kubectl(crd, "explain", field)),
            timeout=30,
            what=f"kubectl explain {field}",
        )

    assert "Horovod slots per host" in explained("dtj.spec.gpusPerWorker")
    assert "cleanPodPolicy" in explained("dtjob.spec.runPolicy")


def test_printer_columns(crd: str, namespace: str) -> None:
    done = kubectl(crd, "apply", "-n", namespace, "-f", "-", stdin=manifest(name="cols"))
    assert done.returncode == 0, done.stderr
    header = kubectl(crd, "get", "dtj", "-n", namespace).stdout.splitlines()[0].split()
    assert header[:6] == ["NAME", "PHASE", "WORKERS", "GPUS", "FRAMEWORK", "RESTARTS"]
