"""Training progress from the launcher's log reaches `status.progress` and `kubectl get dtj -o wide`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client

from testbed.kube_wait import wait_for
from testbed.operator_harness import OperatorProcess, kubectl
from testbed.sim_logs import append_log, serve_pod_log

pytestmark = pytest.mark.integration
GROUP, VERSION, PLURAL = "dtjob.io", "v1alpha1", "distributedtrainingjobs"


def progress_line(step: int, images_per_sec: float) -> str:
    record = {"epoch": 1, "epochs": 2, "step": step, "stepsPerEpoch": 50, "imagesPerSec": images_per_sec,
              "loss": 6.5 - step / 100, "updatedAt": "2026-11-22T03:00:00Z"}  # fmt: skip
    return f"[0]<stdout>:DTJOB_PROGRESS {json.dumps(record)}"


@pytest.fixture
def operator_env() -> dict[str, str]:
    return {"DTJOB_PROGRESS_SECONDS": "1"}


def test_progress_follows_the_launcher_log(
    api_client: client.ApiClient,
    core_v1: client.CoreV1Api,
    kubeconfig: str,
    namespace: str,
    operator: OperatorProcess,
    simulated_pool: list[client.V1Node],
    tmp_path: Path,
) -> None:
    custom = client.CustomObjectsApi(api_client)
    job: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DistributedTrainingJob",
        "metadata": {"name": "progress"},
        "spec": {
            "framework": "pytorch",
            "workers": 2,
            "gpusPerWorker": 4,
            # Long enough to report twice; a cue ends it afterwards.
            "launcher": {"podAnnotations": {"sim.dtjob.io/run-duration": "10m"}},
        },
    }
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job)

    def launcher_pod() -> str | None:
        pods = core_v1.list_namespaced_pod(namespace, label_selector="dtjob.io/role=launcher").items
        return pods[0].metadata.name if pods else None

    pod = wait_for(launcher_pod, timeout=90, what="the launcher pod")
    log = tmp_path / "launcher.log"
    append_log(log, "horovodrun: 8 ranks", progress_line(10, 2400.04))
    serve_pod_log(api_client, namespace, pod, "launcher", log)

    def status() -> dict[str, Any]:
        job = cast(
            dict[str, Any], custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "progress")
        )
        return job.get("status") or {}

    def progress() -> dict[str, Any] | None:
        return status().get("progress")

    first = wait_for(lambda: (p := progress()) and p["step"] == 10 and p, timeout=60, what="first progress")
    assert first["imagesPerSec"] == 2400.0
    assert first["summary"] == "epoch 1/2 step 10/50 2400 img/s loss 6.400"

    append_log(log, progress_line(20, 2500.0), "epoch 1/2 step 20/50 loss 6.3000")
    wait_for(lambda: (p := progress()) and p["step"] == 20, timeout=60, what="progress to follow the log")
    wide = kubectl(kubeconfig, "get", "dtj", "progress", "-n", namespace, "-o", "wide")
    assert "epoch 1/2 step 20/50 2500 img/s" in wide.stdout, wide.stdout

    # After the job ends the last progress stays: it is the run's final word on throughput.
    core_v1.patch_namespaced_pod(
        pod, namespace, {"metadata": {"annotations": {"sim.dtjob.io/outcome": "Succeeded"}}}
    )
    wait_for(lambda: status().get("phase") == "Succeeded", timeout=60, what="job Succeeded")
    assert progress() == {**first, "step": 20, "imagesPerSec": 2500.0, "loss": 6.3,
                          "summary": "epoch 1/2 step 20/50 2500 img/s loss 6.300"}  # fmt: skip
