"""Jobs that really run: real pods on the real node, sshd in the workers, horovodrun/mpirun over SSH between
pods found through cluster DNS, ResNet-50 training in the images, rank 0's results and every pod's log in
Azurite, all through the operator.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from azure.storage.blob import BlobServiceClient
from dtjob.azure.emulator import Azurite
from dtjob.storage import STORAGE_KEY_LABEL
from kubernetes import client

from tests.e2e.conftest import RealCluster
from tests.integration.operator_harness import Jobs, OperatorProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

KEY_SECRET = "storage-key"
STEPS = 4


def storage_key_secret(jobs: Jobs, azurite: Azurite) -> None:
    secret = client.V1Secret(
        metadata=client.V1ObjectMeta(name=KEY_SECRET, labels={STORAGE_KEY_LABEL: "true"}),
        string_data={"azurestorageaccountkey": azurite.account_key},
    )
    jobs.core.create_namespaced_secret(jobs.ns, secret)


def output_location(azurite: Azurite, container: str) -> dict[str, Any]:
    return {
        "endpoint": azurite.endpoint,
        "container": container,
        "prefix": "runs",
        "credentials": {"authMode": "accountKey", "secretRef": {"name": KEY_SECRET}},
    }


def tiny_training(**extra: Any) -> dict[str, Any]:
    """A few real steps of ResNet-50 at a tiny image size: minutes on two CPU cores, not hours."""
    return {
        "batchSizePerGpu": 2,
        "epochs": 1,
        "stepsPerEpoch": STEPS,
        "imageSize": 32,
        "logInterval": 1,
        "warmupEpochs": 0,
        "amp": False,
        **extra,
    }


def new_container(azurite: Azurite) -> str:
    container = f"e2e{uuid.uuid4().hex[:12]}"
    BlobServiceClient(azurite.endpoint, credential=azurite.shared_key).create_container(container)
    return container


def run_metrics(azurite: Azurite, container: str, jobs: Jobs, name: str) -> dict[str, Any]:
    """metrics.json that rank 0 wrote and uploaded at the end of the run."""
    uid = jobs.get(name)["metadata"]["uid"]
    metrics: dict[str, Any] = json.loads(
        blob_text(azurite, container, f"runs/{jobs.ns}/{name}/{uid}/metrics.json")
    )
    return metrics


def assert_trained_together(metrics: dict[str, Any], world_size: int = 2) -> None:
    """Both ranks trained every step and their allreduced weights ended identical."""
    assert metrics["worldSize"] == world_size, metrics
    assert metrics["globalStep"] == STEPS * metrics["epochs"], metrics
    assert metrics["weightsConsistent"] is True, metrics["weightDigests"]


def wait_finished(
    jobs: Jobs, name: str, timeout: float, azurite: Azurite | None = None, container: str = ""
) -> dict[str, Any]:
    """The final status of a job that must succeed; otherwise fail showing its status and its pods' logs
    (as uploaded to `container`, or live from the API server)."""
    try:
        status = jobs.wait_phase(name, "Succeeded", "Failed", timeout=timeout)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{pod_logs(jobs, name, azurite, container)}") from None
    if status["phase"] != "Succeeded":
        raise AssertionError(
            f"{name} ended {status['phase']}:\n{json.dumps(status, indent=1)}\n"
            f"{pod_logs(jobs, name, azurite, container)}"
        )
    return status


def pod_logs(jobs: Jobs, name: str, azurite: Azurite | None, container: str, lines: int = 40) -> str:
    """The last lines of each of the job's pod logs, for a failure message."""
    texts: dict[str, str] = {}
    if azurite is not None and container:
        uid = (jobs.get(name) or {}).get("metadata", {}).get("uid", "")
        prefix = f"runs/{jobs.ns}/{name}/{uid}/logs/"
        for blob in blob_names(azurite, container, prefix):
            texts[blob.removeprefix(prefix)] = blob_text(azurite, container, blob)
    for pod in jobs.pods(name):
        pod_name = str(pod.metadata.name)
        try:
            texts.setdefault(pod_name, jobs.core.read_namespaced_pod_log(pod_name, jobs.ns))
        except client.ApiException as err:
            texts.setdefault(pod_name, f"(no log: {err.status})")
    return "\n".join(
        f"--- {pod}:\n" + "\n".join(text.splitlines()[-lines:]) for pod, text in sorted(texts.items())
    )


def blob_names(azurite: Azurite, container: str, prefix: str) -> list[str]:
    service = BlobServiceClient(azurite.endpoint, credential=azurite.shared_key)
    return sorted(b.name for b in service.get_container_client(container).list_blobs(name_starts_with=prefix))


def blob_text(azurite: Azurite, container: str, name: str) -> str:
    service = BlobServiceClient(azurite.endpoint, credential=azurite.shared_key)
    return service.get_blob_client(container, name).download_blob().readall().decode(errors="replace")


def test_pytorch_trains_for_real_and_uploads_results_and_logs(
    real_cluster: RealCluster,
    real_jobs: Jobs,
    real_operator: OperatorProcess,
    node_azurite: Azurite,
) -> None:
    container = new_container(node_azurite)
    storage_key_secret(real_jobs, node_azurite)
    name = "torch"
    started = time.monotonic()
    real_jobs.create(
        name,
        framework="pytorch",
        workers=2,
        gpusPerWorker=1,
        dataset={"source": "synthetic"},
        hyperparameters=tiny_training(),
        runPolicy={"backoffLimit": 0, "activeDeadlineSeconds": 1200, "cleanPodPolicy": "Running"},
        output=output_location(node_azurite, container),
    )
    status = wait_finished(real_jobs, name, timeout=900, azurite=node_azurite, container=container)
    print(f"[e2e] pytorch job succeeded in {time.monotonic() - started:.0f}s")

    # Real progress: rank 0's DTJOB_PROGRESS lines, read from the launcher's log through the API server.
    progress = status.get("progress")
    assert progress is not None, "status.progress was never filled from the launcher's log"
    assert progress["stepsPerEpoch"] == STEPS
    assert 1 <= progress["step"] <= STEPS
    assert progress["imagesPerSec"] > 0

    uid = real_jobs.get(name)["metadata"]["uid"]
    run = f"runs/{real_jobs.ns}/{name}/{uid}/"
    names = blob_names(node_azurite, container, run)
    # Rank 0's results, uploaded from worker 0 over ssh with the write-only SAS.
    assert f"{run}model.pt" in names, names
    assert f"{run}labels.json" in names, names
    assert_trained_together(run_metrics(node_azurite, container, real_jobs, name))
    # Every pod's real log.
    logs = {n.removeprefix(f"{run}logs/") for n in names if n.startswith(f"{run}logs/")}
    assert {f"{name}-worker-0.log", f"{name}-worker-1.log"} <= logs, names
    launcher_logs = [n for n in logs if n.startswith(f"{name}-launcher")]
    assert launcher_logs, names
    launcher_log = blob_text(node_azurite, container, f"{run}logs/{launcher_logs[0]}")
    assert "DTJOB_PROGRESS" in launcher_log
    # The SAS Secrets are gone once the job has finished.
    secrets = real_jobs.core.list_namespaced_secret(real_jobs.ns).items
    assert not [s.metadata.name for s in secrets if s.metadata.name.startswith(f"{name}-sas-")]


@pytest.mark.parametrize(
    ("framework", "runner"),
    [("tensorflow", "mpirun"), ("keras", "horovodrun")],
)
def test_tensorflow_and_keras_train_for_real(
    real_jobs: Jobs,
    real_operator: OperatorProcess,
    node_azurite: Azurite,
    framework: str,
    runner: str,
) -> None:
    container = new_container(node_azurite)
    storage_key_secret(real_jobs, node_azurite)
    name = f"{framework[:5]}-{runner[:3]}"
    started = time.monotonic()
    real_jobs.create(
        name,
        framework=framework,
        workers=2,
        gpusPerWorker=1,
        dataset={"source": "synthetic"},
        hyperparameters=tiny_training(),
        launcher={"runner": runner},
        runPolicy={"backoffLimit": 0, "activeDeadlineSeconds": 1200, "cleanPodPolicy": "Running"},
        output=output_location(node_azurite, container),
    )
    status = wait_finished(real_jobs, name, timeout=900, azurite=node_azurite, container=container)
    print(f"[e2e] {framework} under {runner} succeeded in {time.monotonic() - started:.0f}s")
    metrics = run_metrics(node_azurite, container, real_jobs, name)
    assert metrics["framework"] == framework
    assert_trained_together(metrics)
    progress = status.get("progress")
    assert progress is not None, pod_logs(real_jobs, name, node_azurite, container, lines=80)
    assert progress["stepsPerEpoch"] == STEPS
