"""The operator against a real API server: kopf runs `python -m dtjob operator` as a subprocess per test.

Pods are simulated by kwok (no containers run); annotations on pod templates cue their fate:
sim.dtjob.io/ready-after, sim.dtjob.io/run-duration (launcher), sim.dtjob.io/outcome=Failed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from dtjob.config import load_config
from dtjob.kube.client import KubeClient
from dtjob.kube.connect import ApiClient
from dtjob.reconcile.job import Children, reconcile
from kubernetes import client

from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess

pytestmark = pytest.mark.integration

LONG_LAUNCHER = {"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}}


def test_happy_path_to_succeeded(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create("happy")
    status = jobs.wait_phase("happy", "Succeeded", timeout=120)
    assert status["workersReady"] == "2/2" or status["workers"]["total"] == 2
    assert status["gpus"] == 8
    assert status["restarts"] == 0
    assert status["startTime"] and status["completionTime"]
    assert status["observedGeneration"] == 1
    succeeded = jobs.condition("happy", "Succeeded")
    assert succeeded and succeeded["status"] == "True" and succeeded["reason"] == "LauncherSucceeded"

    # The launcher pod, made by the operator itself, is the launch's outcome.
    launcher = jobs.launcher("happy")
    assert launcher is not None and launcher.status.phase == "Succeeded"
    # cleanPodPolicy Running (default): idle workers are deleted to free their GPUs.
    wait_for(lambda: not jobs.pods("happy", "worker"), timeout=60, what="workers cleaned up")
    # Exactly one of each world object, all owned by the job.
    uid = (jobs.get("happy") or {})["metadata"]["uid"]
    selector = "dtjob.io/job-name=happy"
    for items in (
        jobs.core.list_namespaced_secret(jobs.ns, label_selector=selector).items,
        jobs.core.list_namespaced_config_map(jobs.ns, label_selector=selector).items,
        jobs.core.list_namespaced_service(jobs.ns, label_selector=selector).items,
        jobs.pods("happy", "launcher"),
    ):
        assert len(items) == 1
        assert items[0].metadata.owner_references[0].uid == uid
    # No batch Job: the operator makes the launcher's pod itself, so no Job controller sits on the start.
    assert jobs.batch.list_namespaced_job(jobs.ns, label_selector=selector).items == []
    hostfile = jobs.core.read_namespaced_config_map("happy-hostfile", jobs.ns).data["hostfile"]
    assert hostfile.splitlines() == [
        f"happy-worker-0.happy-workers.{jobs.ns}.svc slots=4",
        f"happy-worker-1.happy-workers.{jobs.ns}.svc slots=4",
    ]
    reasons = {e.reason for e in jobs.events("happy")}
    # One event for the start (Running), none for its routine steps, which the status shows.
    assert {"Running", "LauncherSucceeded"} <= reasons and not {"Pending", "Starting"} & reasons, reasons


def test_launcher_held_until_every_worker_ready(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create("gate", worker={"podAnnotations": {"sim.dtjob.io/ready-after": "6s"}})
    wait_for(lambda: len(jobs.pods("gate", "worker")) == 2, timeout=60, what="worker pods created")
    # While the workers are scheduled but not Ready, the job waits; its launcher pod, made with the world,
    # is held off every node by the operator's gate.
    status = jobs.wait_phase("gate", "Starting", "Pending")
    assert status["workersReady"] == "0/2"
    held = wait_for(lambda: jobs.pods("gate", "launcher"), timeout=30, what="the launcher's pod")[0]
    assert [g.name for g in held.spec.scheduling_gates or ()] == ["dtjob.io/workers-ready"]
    assert not held.spec.node_name
    jobs.wait_phase("gate", "Running", "Succeeded", timeout=120)
    launchers = jobs.pods("gate", "launcher")
    assert [p.metadata.uid for p in launchers] == [held.metadata.uid]  # released, not made again
    assert not launchers[0].spec.scheduling_gates
    ready_times = [
        c.last_transition_time
        for p in jobs.pods("gate", "worker")
        for c in p.status.conditions or []
        if c.type == "Ready" and c.status == "True"
    ]
    placed = [c.last_transition_time for c in launchers[0].status.conditions if c.type == "PodScheduled"]
    assert len(ready_times) == 2 and len(placed) == 1
    assert placed[0] >= max(ready_times)


def test_worker_failure_restarts_then_recovers(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create("flaky", launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "20s"}})
    jobs.wait_phase("flaky", "Running", timeout=120)
    first = {p.metadata.name: p.metadata.uid for p in jobs.live_workers("flaky")}
    jobs.annotate_pod("flaky-worker-1", {"sim.dtjob.io/outcome": "Failed"})
    status = jobs.wait_phase("flaky", "Restarting")
    assert status["restarts"] == 1
    cond = jobs.condition("flaky", "Restarting")
    assert cond and cond["status"] == "True" and cond["reason"] == "WorkerFailed"
    assert "flaky-worker-1" in cond["message"]
    status = jobs.wait_phase("flaky", "Running", timeout=120)
    assert status["restarts"] == 1
    workers = jobs.live_workers("flaky")
    assert sorted(p.metadata.name for p in workers) == ["flaky-worker-0", "flaky-worker-1"]
    assert all(p.metadata.labels["dtjob.io/attempt"] == "1" for p in workers)
    assert not {p.metadata.uid for p in workers} & set(first.values())
    cond = jobs.condition("flaky", "Restarting")
    assert cond and cond["status"] == "False" and cond["reason"] == "Recovered"
    jobs.wait_phase("flaky", "Succeeded", timeout=120)
    jobs.wait_event("flaky", "Recovered")


def test_repeated_failure_fails_at_backoff_limit_naming_the_pod(
    jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create(
        "doomed",
        worker={"podAnnotations": {"sim.dtjob.io/outcome": "Failed"}},
        launcher=LONG_LAUNCHER,
        runPolicy={"backoffLimit": 1},
    )
    status = jobs.wait_phase("doomed", "Failed", timeout=120)
    assert status["restarts"] == 1
    cond = jobs.condition("doomed", "Failed")
    assert cond and cond["reason"] == "WorkerFailed"
    assert "doomed-worker-" in cond["message"] and "exit code 1" in cond["message"]
    assert "backoffLimit (1)" in cond["message"]
    assert status["message"] == cond["message"]


def test_launcher_failure_is_named(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create(
        "badlaunch",
        launcher={"podAnnotations": {"sim.dtjob.io/outcome": "Failed"}},
        runPolicy={"backoffLimit": 0},
    )
    jobs.wait_phase("badlaunch", "Failed", timeout=120)
    cond = jobs.condition("badlaunch", "Failed")
    assert cond and cond["reason"] == "LauncherFailed"
    assert "launcher pod badlaunch-launcher failed: " in cond["message"]


def test_deadline_exceeded_fails_and_cleans_up(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create("slow", launcher=LONG_LAUNCHER, runPolicy={"activeDeadlineSeconds": 8})
    jobs.wait_phase("slow", "Failed", timeout=90)
    cond = jobs.condition("slow", "Failed")
    assert cond and cond["reason"] == "DeadlineExceeded"
    wait_for(lambda: not jobs.live_workers("slow"), timeout=60, what="workers deleted")
    wait_for(lambda: jobs.launcher("slow") is None, timeout=60, what="running launcher deleted")


def test_suspend_deletes_pods_and_resume_recreates(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create("pausable", launcher=LONG_LAUNCHER)
    jobs.wait_phase("pausable", "Running", timeout=120)
    jobs.patch_spec("pausable", {"runPolicy": {"suspend": True}})
    jobs.wait_phase("pausable", "Suspended")
    wait_for(lambda: not jobs.pods("pausable", "worker"), timeout=60, what="workers deleted on suspend")
    wait_for(lambda: jobs.launcher("pausable") is None, timeout=60, what="launcher deleted on suspend")
    assert jobs.get("pausable") is not None
    suspended = jobs.condition("pausable", "Suspended")
    assert suspended and suspended["status"] == "True"
    jobs.patch_spec("pausable", {"runPolicy": {"suspend": False}})
    status = jobs.wait_phase("pausable", "Running", timeout=120)
    assert status["restarts"] == 0
    assert len(jobs.live_workers("pausable")) == 2
    jobs.wait_event("pausable", "Resumed")


def test_delete_cascades_to_every_child(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create("doomed-world", launcher=LONG_LAUNCHER)
    jobs.wait_phase("doomed-world", "Running", timeout=120)
    jobs.delete("doomed-world")
    selector = "dtjob.io/job-name=doomed-world"

    def children() -> list[str]:
        found: list[str] = [
            str(p.metadata.name)
            for p in jobs.core.list_namespaced_pod(jobs.ns, label_selector=selector).items
        ]
        for lister in (jobs.core.list_namespaced_secret, jobs.core.list_namespaced_config_map,
                       jobs.core.list_namespaced_service, jobs.batch.list_namespaced_job):  # fmt: skip
            found += [str(o.metadata.name) for o in lister(jobs.ns, label_selector=selector).items]
        return found

    wait_for(lambda: not children(), timeout=90, what="garbage collection of every child")
    assert jobs.get("doomed-world") is None  # no finalizer holds it


def test_operator_restart_mid_run_keeps_the_world(
    jobs: Jobs, operator: OperatorProcess, kubeconfig: str, namespace: str, tmp_path: Path
) -> None:
    jobs.create("steady", launcher=LONG_LAUNCHER)
    jobs.wait_phase("steady", "Running", timeout=120)
    before = {p.metadata.name: p.metadata.uid for p in jobs.pods("steady")}
    launcher_uid = jobs.launcher("steady").metadata.uid
    status_before = jobs.status("steady")
    operator.stop()

    second = OperatorProcess(kubeconfig, namespace, tmp_path / "operator-2.log")
    second.start()
    try:
        # The restarted operator reconciles the job from its initial listing; wait for that, then compare.
        wait_for(lambda: second.reconciles() >= 1, timeout=60, what="a reconcile after restart")
        assert {p.metadata.name: p.metadata.uid for p in jobs.pods("steady")} == before
        assert jobs.launcher("steady").metadata.uid == launcher_uid
        after = jobs.status("steady")
        assert after["phase"] == "Running" and after["restarts"] == 0
        assert after["conditions"] == status_before["conditions"]
        # And it still acts: a failure seen only by the new operator restarts the world once.
        jobs.annotate_pod("steady-worker-0", {"sim.dtjob.io/outcome": "Failed"})
        status = jobs.wait_phase("steady", "Restarting", "Running", timeout=60)
        wait_for(lambda: jobs.status("steady").get("restarts") == 1, timeout=60, what="one restart")
        status = jobs.wait_phase("steady", "Running", timeout=120)
        assert status["restarts"] == 1
        assert len(jobs.live_workers("steady")) == 2
    finally:
        second.stop()


def test_missing_pvc_waits_without_creating_children(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create(
        "nodata",
        dataset={"source": "imagenet", "volume": {"persistentVolumeClaim": {"claimName": "imagenet"}}},
    )
    status = jobs.wait_phase("nodata", "Pending")
    wait_for(lambda: jobs.condition("nodata", "Created"), timeout=30, what="Created condition")
    cond = jobs.condition("nodata", "Created")
    assert cond and cond["status"] == "False" and cond["reason"] == "PVCNotFound"
    assert "claimName" in cond["message"] and "'imagenet'" in cond["message"]
    assert "imagenet" in status["message"]
    assert not jobs.pods("nodata")
    assert not jobs.core.list_namespaced_secret(jobs.ns, label_selector="dtjob.io/job-name=nodata").items
    # Once the claim exists the job goes ahead (recheck without any event on the job itself).
    claim: Any = {
        "metadata": {"name": "imagenet"},
        "spec": {"accessModes": ["ReadOnlyMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    jobs.core.create_namespaced_persistent_volume_claim(jobs.ns, claim)
    wait_for(lambda: len(jobs.pods("nodata", "worker")) == 2, timeout=60, what="workers after PVC appears")


def test_missing_pull_secret_and_oversized_workers(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create("nosecret", imagePullSecrets=[{"name": "acr-creds"}])
    jobs.create("toobig", gpusPerWorker=6)
    jobs.wait_phase("nosecret", "Pending")
    wait_for(lambda: jobs.condition("nosecret", "Created"), timeout=30, what="Created condition")
    cond = jobs.condition("nosecret", "Created")
    assert cond and cond["reason"] == "ImagePullSecretNotFound" and "acr-creds" in cond["message"]
    status = jobs.wait_phase("toobig", "Failed")
    assert status["message"].startswith("spec.gpusPerWorker:")
    assert "at most 4" in status["message"]
    assert not jobs.pods("nosecret") and not jobs.pods("toobig")


def test_child_rejected_by_api_fails_without_pods(jobs: Jobs, operator: OperatorProcess) -> None:
    # Each quantity is valid (the CRD checks that); only the API server compares requests with limits.
    jobs.create("badqty", worker={"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}})
    status = jobs.wait_phase("badqty", "Failed")
    cond = jobs.condition("badqty", "Failed")
    assert cond and cond["reason"] == "ChildRejected"
    assert "badqty-worker-" in status["message"] and "rejected by the API server" in status["message"]
    assert "must be less than or equal to cpu limit" in status["message"]
    wait_for(lambda: not jobs.pods("badqty"), timeout=30, what="no pods left behind")


def test_ttl_deletes_finished_job_and_clean_pod_policy_none_keeps_pods(
    jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create("shortlived", runPolicy={"ttlSecondsAfterFinished": 3})
    jobs.create("keeper", runPolicy={"cleanPodPolicy": "None"})
    jobs.wait_phase("shortlived", "Succeeded", timeout=120)
    wait_for(lambda: jobs.get("shortlived") is None, timeout=60, what="job deleted after its TTL")
    wait_for(lambda: not jobs.pods("shortlived"), timeout=60, what="its pods collected")
    jobs.wait_phase("keeper", "Succeeded", timeout=120)
    workers = jobs.live_workers("keeper")
    assert sorted(p.metadata.name for p in workers) == ["keeper-worker-0", "keeper-worker-1"]
    assert jobs.get("keeper") is not None


def test_reconcile_twice_changes_nothing(
    jobs: Jobs, operator: OperatorProcess, api_client: client.ApiClient, operator_api: ApiClient
) -> None:
    jobs.create("twice", launcher=LONG_LAUNCHER)
    jobs.wait_phase("twice", "Running", timeout=120)
    operator.stop()
    kube = KubeClient(operator_api)

    def snapshot() -> dict[str, str]:
        selector = "dtjob.io/job-name=twice"
        objects: list[Any] = [*jobs.core.list_namespaced_pod(jobs.ns, label_selector=selector).items,
                   *jobs.core.list_namespaced_secret(jobs.ns, label_selector=selector).items,
                   *jobs.core.list_namespaced_config_map(jobs.ns, label_selector=selector).items,
                   *jobs.core.list_namespaced_service(jobs.ns, label_selector=selector).items,
                   *jobs.batch.list_namespaced_job(jobs.ns, label_selector=selector).items]  # fmt: skip
        versions = {
            f"{o.kind or type(o).__name__}/{o.metadata.name}": o.metadata.resource_version for o in objects
        }
        versions["job"] = (jobs.get("twice") or {})["metadata"]["resourceVersion"]
        return versions

    def children() -> Children:
        selector = "dtjob.io/job-name=twice"
        pods = jobs.core.list_namespaced_pod(jobs.ns, label_selector=selector).items
        return Children(pods=tuple(api_client.sanitize_for_serialization(p) for p in pods))

    def settled() -> dict[str, str] | None:
        # Wait until no other controller (the EndpointSlice controller, kwok) is still writing, so only the
        # reconcile can move a version.
        first = snapshot()
        time.sleep(2)
        return first if snapshot() == first else None

    before = wait_for(settled, timeout=60, interval=0, what="children no controller still writes")
    for _ in range(2):
        reconcile(kube, load_config(), jobs.ns, "twice", children())
    assert snapshot() == before
