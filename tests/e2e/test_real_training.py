"""Jobs that really run: real pods on the real node, sshd in the workers, horovodrun/mpirun over SSH between
pods found through cluster DNS, ResNet-50 training in the images, rank 0's results and every pod's log in
Azurite, all through the operator; `dtjob logs -f` follows one live.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hack.demo_job import demo_job
from testbed.azurite import Azurite
from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess
from tests.e2e.conftest import RealCluster
from tests.e2e.real_jobs import (
    STEPS,
    assert_trained_together,
    blob_names,
    blob_text,
    create_tiny_job,
    new_container,
    output_location,
    pod_logs,
    run_metrics,
    storage_key_secret,
    wait_finished,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]


class ProgressSampler:
    """status.progress read once a second while a job runs, to report how far its ETA was off."""

    def __init__(self, jobs: Jobs, name: str) -> None:
        self.samples: list[tuple[float, dict[str, Any]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(jobs, name), daemon=True)
        self._thread.start()

    def _run(self, jobs: Jobs, name: str) -> None:
        while not self._stop.wait(1.0):
            self.samples.append((time.monotonic(), dict(jobs.status(name).get("progress") or {})))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def eta_report(self, ended: float) -> str:
        """Each ETA seen before the end against when training really ended (`ended`, monotonic)."""
        errors = [(t + p["etaSeconds"] - ended, ended - t) for t, p in self.samples if p.get("etaSeconds")]
        if not errors:
            return "no ETA was published before the run ended (too few steps for a rate)"
        first_error, first_left = errors[0]
        median = statistics.median(abs(e) for e, _ in errors)
        return (
            f"{len(errors)} ETA(s); the first, {first_left:.0f}s before the end, was off by "
            f"{first_error:+.0f}s ({first_error / max(first_left, 1):+.0%}); "
            f"median absolute error {median:.0f}s"
        )


def test_the_demo_job_trains_pytorch_for_real_and_uploads_results_and_logs(
    real_cluster: RealCluster,
    real_jobs: Jobs,
    real_operator: OperatorProcess,
    node_azurite: Azurite,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    container = new_container(node_azurite)
    # The demo's own job (`make demo`): the same manifest, shrunk the same way, on the same image.
    manifest = demo_job(output_location(node_azurite, container), steps=STEPS)
    name = manifest["metadata"]["name"]
    started = time.monotonic()
    storage_key_secret(real_jobs, node_azurite)
    real_jobs.create(name, **manifest["spec"])
    sampler = ProgressSampler(real_jobs, name)
    # A user following the job live from the start, as `dtjob logs -f` does, until it ends by itself.
    followed = tmp_path / "followed.log"
    argv = [sys.executable, "-m", "dtjob", "logs", name, "-f", "-n", real_jobs.ns]
    with followed.open("wb") as out:
        follower = subprocess.Popen(
            [*argv, "--kubeconfig", real_cluster.kubeconfig], stdout=out, stderr=subprocess.PIPE
        )
    try:
        status = wait_finished(real_jobs, name, timeout=900, azurite=node_azurite, container=container)
        print(f"[e2e] pytorch job succeeded in {time.monotonic() - started:.0f}s")
        _, follower_err = follower.communicate(timeout=90)
    finally:
        follower.kill()
        sampler.stop()
    assert follower.returncode == 0, follower_err
    # When training ended: the first sample at 100%, else the end of the wait.
    ended = next((t for t, p in sampler.samples if p.get("percent") == 100.0), time.monotonic())
    with capsys.disabled():  # in the run's output even when the test passes
        print(f"\n[e2e] ETA error: {sampler.eta_report(ended)}")

    # Real progress: rank 0's DTJOB_PROGRESS lines, read from the launcher's log through the API server.
    progress = status.get("progress")
    assert progress is not None, "status.progress was never filled from the launcher's log"
    assert progress["stepsPerEpoch"] == STEPS
    assert 1 <= progress["step"] <= STEPS
    assert progress["imagesPerSec"] > 0
    # The last record read (every few seconds) may precede the last step; at the last: 100%, nothing left.
    assert 0 < progress["percent"] <= 100.0, progress
    if progress["step"] == STEPS:
        assert (progress["percent"], progress["etaSeconds"]) == (100.0, 0), progress

    uid = real_jobs.get(name)["metadata"]["uid"]
    run = f"runs/{real_jobs.ns}/{name}/{uid}/"
    names = blob_names(node_azurite, container, run)
    # Rank 0's results, uploaded from worker 0 over ssh with the write-only SAS.
    assert f"{run}model.pt" in names, names
    assert f"{run}labels.json" in names, names
    metrics = run_metrics(node_azurite, container, real_jobs, name)
    assert metrics["arch"] == "resnet50"
    assert_trained_together(metrics)
    # Every pod's real log.
    logs = {n.removeprefix(f"{run}logs/") for n in names if n.startswith(f"{run}logs/")}
    assert {f"{name}-worker-0.log", f"{name}-worker-1.log"} <= logs, names
    launcher_logs = [n for n in logs if n.startswith(f"{name}-launcher")]
    assert launcher_logs, names
    launcher_log = blob_text(node_azurite, container, f"{run}logs/{launcher_logs[0]}")
    assert "DTJOB_PROGRESS" in launcher_log
    # What the follower printed live is the launcher's log: every progress record rank 0 wrote.
    live = followed.read_text()
    progress_lines = [line for line in launcher_log.splitlines() if "DTJOB_PROGRESS" in line]
    assert progress_lines and all(line in live for line in progress_lines), live[-2000:]

    # The SAS Secrets go once the logs are uploaded: a reconcile or two after the phase turns Succeeded.
    def sas_secrets() -> list[str]:
        secrets = real_jobs.core.list_namespaced_secret(real_jobs.ns).items
        return [str(s.metadata.name) for s in secrets if str(s.metadata.name).startswith(f"{name}-sas-")]

    wait_for(lambda: not sas_secrets(), timeout=60, what=f"{name}'s SAS Secrets deleted")
    assert real_jobs.status(name).get("sasSecretsDeleted") is True


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
    name = f"{framework[:5]}-{runner[:3]}"
    started = time.monotonic()
    create_tiny_job(
        real_jobs, name, node_azurite, container, framework=framework, launcher={"runner": runner}
    )
    status = wait_finished(real_jobs, name, timeout=900, azurite=node_azurite, container=container)
    print(f"[e2e] {framework} under {runner} succeeded in {time.monotonic() - started:.0f}s")
    metrics = run_metrics(node_azurite, container, real_jobs, name)
    assert metrics["framework"] == framework and metrics["arch"] == "resnet50"
    assert_trained_together(metrics)
    progress = status.get("progress")
    assert progress is not None, pod_logs(real_jobs, name, node_azurite, container, lines=80)
    assert progress["stepsPerEpoch"] == STEPS
