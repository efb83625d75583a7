"""Training progress from the launcher's log reaches `status.progress` and `kubectl get dtj -o wide`; a failed
launcher's message quotes the error line a rank left in that log; a world whose log shows no progress past
runPolicy.progressDeadlineSeconds is restarted."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from dtjob.timefmt import parse_time
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess, kubectl
from testbed.sim_logs import append_log, serve_pod_log

pytestmark = pytest.mark.integration
GROUP, VERSION, PLURAL = "dtjob.io", "v1alpha1", "distributedtrainingjobs"


def progress_line(step: int, images_per_sec: float, steps_per_sec: float | None = None) -> str:
    record = {"epoch": 1, "epochs": 2, "step": step, "stepsPerEpoch": 50, "imagesPerSec": images_per_sec,
              "loss": 6.5 - step / 100, "updatedAt": "2026-11-22T03:00:00Z", "worldSize": 8,
              "globalBatch": 256, "stepsPerSec": steps_per_sec}  # fmt: skip
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
    # The trainer's first record has no pace yet: percent done, no ETA.
    assert first["summary"] == "epoch 1/2 step 10/50 2400 img/s loss 6.400 10.0%"
    assert first["percent"] == 10.0 and "etaSeconds" not in first

    # 80 of 100 steps left at 0.1 steps/sec.
    append_log(log, progress_line(20, 2500.0, 0.1), "epoch 1/2 step 20/50 loss 6.3000")
    wait_for(lambda: (p := progress()) and p["step"] == 20, timeout=60, what="progress to follow the log")
    wide = kubectl(kubeconfig, "get", "dtj", "progress", "-n", namespace, "-o", "wide")
    assert "epoch 1/2 step 20/50 2500 img/s" in wide.stdout, wide.stdout
    # kubectl aligns its columns: each is read between its heading and the next one's.
    header, row = wide.stdout.splitlines()[:2]
    percent, eta, message = (header.index(f" {name} ") + 1 for name in ("PERCENT", "ETA", "MESSAGE"))
    assert row[percent:eta].split() == ["20"] and row[eta:message].split() == ["13m20s"], wide.stdout

    # After the job ends the last progress stays: it is the run's final word on throughput.
    core_v1.patch_namespaced_pod(
        pod, namespace, {"metadata": {"annotations": {"sim.dtjob.io/outcome": "Succeeded"}}}
    )
    wait_for(lambda: status().get("phase") == "Succeeded", timeout=60, what="job Succeeded")
    summary = "epoch 1/2 step 20/50 2500 img/s loss 6.300 20.0% ETA 13m20s"
    assert progress() == {**first, "step": 20, "imagesPerSec": 2500.0, "loss": 6.3, "percent": 20.0,
                          "stepsPerSec": 0.1, "etaSeconds": 800, "eta": "13m20s",
                          "summary": summary}  # fmt: skip


def test_a_failed_launcher_quotes_the_ranks_error_line(
    api_client: client.ApiClient,
    core_v1: client.CoreV1Api,
    jobs: Jobs,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    launcher = {"podAnnotations": {"sim.dtjob.io/run-duration": "10m"}}
    jobs.create("nogpu", launcher=launcher, runPolicy={"backoffLimit": 0})
    pod = wait_for(
        lambda: (pods := jobs.pods("nogpu", "launcher")) and pods[0].metadata.name,
        timeout=90,
        what="launcher",
    )
    log = tmp_path / "launcher.log"
    no_gpu = "DTJOB_EXPECT_GPU is set (the job asks for GPUs) but no GPU is visible to this rank"
    append_log(
        log,
        "[0]<stdout>:dtjob_train pytorch: 8 ranks",
        f"[1]<stderr>:error: nogpu-worker-0 local rank 1: {no_gpu}: check the node's NVIDIA driver",
        "Process 1 exit with status code 3.",
    )
    serve_pod_log(api_client, namespace, pod, "launcher", log)

    def served() -> bool:  # before the failure, or the operator would read no log
        try:
            text = core_v1.read_namespaced_pod_log(pod, namespace, container="launcher")
        except ApiException:
            return False
        return "Process 1" in (text or "")  # the client can answer None before kwok serves the file

    wait_for(served, timeout=30, what="the launcher's log served")
    jobs.annotate_pod(pod, {"sim.dtjob.io/outcome": "Failed"})
    jobs.wait_phase("nogpu", "Failed", timeout=90)
    cond = jobs.condition("nogpu", "Failed")
    quoted = f"rank 1 (pod nogpu-worker-0): error: nogpu-worker-0 local rank 1: {no_gpu}"
    assert cond and cond["reason"] == "LauncherFailed" and quoted in cond["message"], cond
    assert cond["message"].startswith(f"launcher pod {pod} failed: Error, exit code 1"), cond
    wait_for(
        lambda: any(quoted in (e.message or "") for e in jobs.events("nogpu")), timeout=30, what="the event"
    )


def test_a_world_that_stops_making_progress_restarts_then_fails_at_its_backoff_limit(
    api_client: client.ApiClient, jobs: Jobs, operator: OperatorProcess, tmp_path: Path
) -> None:
    """runPolicy.progressDeadlineSeconds on the real control plane: each record one step further restarts the
    clock; a world silent past the deadline restarts (counted), and the next world, which prints no record
    at all, is timed from its start of Running and fails the job at backoffLimit."""
    launcher = {"podAnnotations": {"sim.dtjob.io/run-duration": "10m"}}
    jobs.create("hang", launcher=launcher, runPolicy={"progressDeadlineSeconds": 30, "backoffLimit": 1})

    def launcher_pod() -> client.V1Pod | None:
        pods = [p for p in jobs.pods("hang", "launcher") if p.metadata.deletion_timestamp is None]
        return pods[0] if pods and pods[0].status.phase == "Running" else None

    first_pod = wait_for(launcher_pod, timeout=90, what="the launcher running")
    first = str(first_pod.metadata.name)
    log = tmp_path / "first.log"
    append_log(log, progress_line(10, 2400.0))
    serve_pod_log(api_client, jobs.ns, first, "launcher", log)
    seen = wait_for(lambda: jobs.status("hang").get("lastProgressTime"), timeout=60, what="step 10 seen")

    # Halfway to the deadline, a step further: the clock starts again from it (the operator has the other
    # 15 s to see the step, on two cores busy with other tests).
    time.sleep(15)
    append_log(log, progress_line(11, 2400.0))
    wait_for(
        lambda: (jobs.status("hang").get("progress") or {}).get("step") == 11, timeout=30, what="step 11 seen"
    )
    again = parse_time(jobs.status("hang")["lastProgressTime"])
    assert again > parse_time(seen)
    running = jobs.condition("hang", "Running")
    assert running and running["status"] == "True", running
    # Past the deadline counted from the world's start and from step 10, within it from step 11.
    past = max(parse_time(running["lastTransitionTime"]), parse_time(seen)) + timedelta(seconds=32)
    time.sleep(max(0.0, (past - datetime.now(UTC)).total_seconds()))
    assert (datetime.now(UTC) - again).total_seconds() < 30, "step 11 was seen too late: this proves nothing"
    assert jobs.status("hang").get("restarts", 0) == 0, jobs.status("hang")

    # Silent past the deadline: the world restarts, counted, naming the last record.
    restarting = wait_for(
        lambda: (c := jobs.condition("hang", "Restarting")) and c["status"] == "True" and c,
        timeout=90,
        what="the hung world restarted",
    )
    assert restarting["reason"] == "ProgressDeadlineExceeded", restarting
    assert f"launcher pod {first} showed no training progress for" in restarting["message"], restarting
    assert "its last record (epoch 1 step 11)" in restarting["message"], restarting
    assert jobs.status("hang")["restarts"] == 1

    # The next world prints no record: timed from its start of Running, it fails the job. Its launcher pod
    # has the same name, and a new uid.
    def next_launcher() -> str | None:
        pod = launcher_pod()
        if pod is None or pod.metadata.uid == first_pod.metadata.uid:
            return None
        return str(pod.metadata.name)

    second = wait_for(next_launcher, timeout=120, what="the next world's launcher")
    quiet = tmp_path / "second.log"
    append_log(quiet, "[0]<stdout>:horovodrun: 8 ranks")
    serve_pod_log(api_client, jobs.ns, second, "launcher", quiet)
    jobs.wait_phase("hang", "Failed", timeout=120)
    failed = jobs.condition("hang", "Failed")
    assert failed and failed["reason"] == "ProgressDeadlineExceeded", failed
    assert "no progress record since the world started running" in failed["message"], failed
    assert "runPolicy.backoffLimit (1) reached after 1 restarts" in failed["message"], failed
    jobs.wait_event("hang", "ProgressDeadlineExceeded", timeout=30)
