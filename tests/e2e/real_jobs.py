"""What the real-node e2e tests share: a tiny real training job writing to Azurite, and reading back its
results, metrics and logs."""

from __future__ import annotations

import copy
import json
import re
import uuid
from datetime import datetime
from typing import Any

from azure.storage.blob import BlobServiceClient
from dtjob.names import STORAGE_KEY_LABEL
from kubernetes import client

from hack.demo_job import ONE_CORE_WORKER_RESOURCES
from testbed.azurite import Azurite
from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs

KEY_SECRET = "storage-key"
# How long a finished job's pod logs may take to reach storage (every pod's log, streamed, on a busy machine).
LOG_UPLOAD_WAIT_S = 120
STEPS = 4
# paced_workers' limit: resnet-tiny at batch 2 trains a step or two a second under it, and a rank starts
# (Python, torch, Horovod) in some 20 s.
PACED_WORKER_CPU = "250m"


def storage_key_secret(jobs: Jobs, azurite: Azurite) -> None:
    """The account-key Secret the jobs sign with, labelled for the operator (made once per namespace)."""
    secret = client.V1Secret(
        metadata=client.V1ObjectMeta(name=KEY_SECRET, labels={STORAGE_KEY_LABEL: "true"}),
        string_data={"azurestorageaccountkey": azurite.account_key},
    )
    try:
        jobs.core.create_namespaced_secret(jobs.ns, secret)
    except client.ApiException as err:
        if err.status != 409:
            raise


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


def tiny_model(*, torchrun: bool = False) -> dict[str, Any]:
    """Spec fields that train the trainer's resnet-tiny (the user's command, with the flags the operator
    builds appended), for a test of what the operator does rather than of ResNet-50, which trains for real
    in test_real_training.py. ResNet-50's 25.6 million parameters cost some 5 CPU-seconds a rank a step on
    two cores even at 32 pixels and batch 2 (the allreduce and the optimizer over them); resnet-tiny's, a few
    milliseconds."""
    module = "ddp" if torchrun else "pytorch"
    return {
        "command": ["python", "-m", f"dtjob_train.{module}"],
        "args": ["--arch", "resnet-tiny"],
        "appendTrainingFlags": True,
    }


def one_core_workers() -> dict[str, Any]:
    """Each worker limited to one core, as the demo's job is (hack.demo_job.ONE_CORE_WORKER_RESOURCES)."""
    return {"worker": {"resources": copy.deepcopy(ONE_CORE_WORKER_RESOURCES)}}


def paced_workers(cpu: str = PACED_WORKER_CPU) -> dict[str, Any]:
    """A CPU limit on every worker: a world that must still be training when something happens to it (a
    worker lost and replaced) trains slowly at little CPU, rather than many fast steps on every core."""
    return {"worker": {"resources": {"limits": {"cpu": cpu}}}}


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
    """The final status of a job that must succeed, once its pods' logs are uploaded when it has an output
    (the operator records the phase first, then uploads them); otherwise fail showing its status and its
    pods' logs (as uploaded to `container`, or live from the API server)."""
    try:
        status = jobs.wait_phase(name, "Succeeded", "Failed", timeout=timeout)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{pod_logs(jobs, name, azurite, container)}") from None
    if status["phase"] != "Succeeded":
        # The pods' logs first and the status on one line: a report that keeps only a failure's first lines
        # still shows why the launcher exited.
        raise AssertionError(
            f"{name} ended {status['phase']}: {status.get('message')}\n"
            f"{pod_logs(jobs, name, azurite, container)}\nstatus: {json.dumps(status)}"
        )
    if "output" not in status:
        return status

    def logs_done() -> dict[str, Any] | None:
        now = jobs.status(name)
        output = now.get("output") or {}
        return now if output.get("logsUploaded") or output.get("logsError") else None

    return wait_for(logs_done, timeout=LOG_UPLOAD_WAIT_S, interval=0.5, what=f"{name}'s pod logs uploaded")


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


def create_tiny_job(jobs: Jobs, name: str, azurite: Azurite, output_container: str, **spec: Any) -> None:
    """A two-worker synthetic PyTorch job of a few tiny steps that writes to `output_container`, signed with
    a labelled account-key Secret; `spec` overrides any top-level field."""
    storage_key_secret(jobs, azurite)
    jobs.create(
        name,
        **{
            "framework": "pytorch",
            "workers": 2,
            "gpusPerWorker": 1,
            "dataset": {"source": "synthetic"},
            # The test bed's GPU node advertises nvidia.com/gpu but gives containers none: train on CPU.
            "env": [{"name": "DTJOB_EXPECT_GPU", "value": "0"}],
            "hyperparameters": tiny_training(),
            "runPolicy": {"backoffLimit": 0, "activeDeadlineSeconds": 1200, "cleanPodPolicy": "Running"},
            "output": output_location(azurite, output_container),
            **one_core_workers(),
            **spec,
        },
    )


RECORD = re.compile(r"DTJOB_PROGRESS (\{[^{}]*\})")


def progress_in(text: str) -> list[dict[str, Any]]:
    """Every whole progress record in a rank 0 log, in order (with its world size and time)."""
    records = []
    for match in RECORD.finditer(text):
        try:
            record = json.loads(match.group(1))
        except ValueError:  # a line another rank's output cut into
            continue
        if isinstance(record.get("worldSize"), int) and record.get("updatedAt"):
            records.append(record)
    return records


def live_launcher_records(jobs: Jobs, name: str) -> list[dict[str, Any]]:
    """Rank 0's progress records so far, from the launcher's live log (read straight from it: the job's
    status takes them up only at the operator's next log read); none before the launcher's pod runs."""
    pod = (jobs.status(name).get("launcher") or {}).get("pod")
    if not pod:
        return []
    try:
        return progress_in(jobs.core.read_namespaced_pod_log(pod, jobs.ns, container="launcher"))
    except client.ApiException:  # not started yet
        return []


def progress_records(
    jobs: Jobs, azurite: Azurite, container: str, name: str, attempt: int | None = None
) -> list[dict[str, Any]]:
    """Every progress record rank 0 printed, in order, from the launcher's uploaded log: the final world's,
    or that of the world a restart replaced (`logs/attempt-N/`)."""
    uid = jobs.get(name)["metadata"]["uid"]
    folder = f"runs/{jobs.ns}/{name}/{uid}/logs/" + (f"attempt-{attempt}/" if attempt is not None else "")
    logs = [
        n for n in blob_names(azurite, container, folder) if "/" not in n[len(folder) :] and "launcher" in n
    ]
    text = "".join(blob_text(azurite, container, n) for n in sorted(logs))
    records = progress_in(text)
    assert records, f"no progress record in the launcher's log ({logs} under {folder}):\n{text[-3000:]}"
    return records


def at(record: dict[str, Any]) -> float:
    """When rank 0 wrote the progress record (its `updatedAt`), in seconds since the epoch."""
    return datetime.fromisoformat(str(record["updatedAt"]).replace("Z", "+00:00")).timestamp()
