"""torchrun jobs on the real node: no launcher, no SSH. Each worker pod runs torchrun with its node rank and
worker 0 hosts the rendezvous, found through the job's headless Service and cluster DNS; the PyTorch trainer
runs under DDP on Gloo, rank 0's results and every pod's log reach Azurite; a failing rank's own error line
reaches the job's status."""

from __future__ import annotations

import json

import pytest

from testbed.azurite import Azurite
from testbed.operator_harness import Jobs, OperatorProcess
from tests.e2e.conftest import IMAGES, RealCluster
from tests.e2e.real_jobs import (
    assert_trained_together,
    blob_names,
    create_tiny_job,
    new_container,
    pod_logs,
    run_metrics,
    storage_key_secret,
    tiny_model,
    wait_finished,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def test_a_two_worker_torchrun_job_trains_with_ddp_and_uploads_its_results_and_logs(
    real_cluster: RealCluster, real_jobs: Jobs, real_operator: OperatorProcess, node_azurite: Azurite
) -> None:
    container = new_container(node_azurite)
    create_tiny_job(real_jobs, "ddp", node_azurite, container, torchrun={}, **tiny_model(torchrun=True))
    status = wait_finished(real_jobs, "ddp", timeout=720, azurite=node_azurite, container=container)

    succeeded = next(c for c in status["conditions"] if c["type"] == "Succeeded")
    assert succeeded["reason"] == "WorkersSucceeded", status
    metrics = run_metrics(node_azurite, container, real_jobs, "ddp")
    assert metrics["runner"] == "torchrun", metrics
    assert_trained_together(metrics)
    assert status["progress"]["worldSize"] == 2, status["progress"]
    # The world had no launcher, no SSH key and no hostfile: only the workers and their Service.
    assert not real_jobs.pods("ddp", "launcher")
    secrets = real_jobs.core.list_namespaced_secret(real_jobs.ns, label_selector="dtjob.io/job-name=ddp")
    assert not [s.metadata.name for s in secrets.items if s.metadata.name.endswith("-ssh")]
    maps = real_jobs.core.list_namespaced_config_map(real_jobs.ns, label_selector="dtjob.io/job-name=ddp")
    assert not maps.items, [m.metadata.name for m in maps.items]
    uid = real_jobs.get("ddp")["metadata"]["uid"]
    logs = blob_names(node_azurite, container, f"runs/{real_jobs.ns}/ddp/{uid}/logs/")
    assert any("ddp-worker-0" in name for name in logs), logs
    assert any("ddp-worker-1" in name for name in logs), logs


FAILING_RANK = """
import os, time
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    raise ValueError("shard 1 of the training set is missing")
time.sleep(300)
"""


def test_a_failing_ranks_own_error_line_reaches_the_status_of_a_torchrun_job(
    real_cluster: RealCluster,
    real_jobs: Jobs,
    real_operator: OperatorProcess,
    node_azurite: Azurite,
) -> None:
    container = new_container(node_azurite)
    storage_key_secret(real_jobs, node_azurite)
    create_tiny_job(
        real_jobs, "ddp-fails", node_azurite, container, framework="custom", image=IMAGES["pytorch"],
        command=["python", "-c", FAILING_RANK], torchrun={}, gpusPerWorker=0, env=[],
    )  # fmt: skip
    status = real_jobs.wait_phase("ddp-fails", "Failed", "Succeeded", timeout=480)
    assert status["phase"] == "Failed", json.dumps(status, indent=1)
    message = status["message"]
    # Rank 1 runs on worker 1: its pod, its exit and the line its traceback ended with, with no ssh or MPI.
    assert "worker pod ddp-fails-worker-1 failed" in message, (
        message + "\n" + pod_logs(real_jobs, "ddp-fails", node_azurite, container)
    )
    assert "ValueError: shard 1 of the training set is missing" in message, message
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "WorkerFailed", status
    assert not real_jobs.pods("ddp-fails", "launcher")
