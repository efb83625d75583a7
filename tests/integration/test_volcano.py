"""Volcano itself places the world: its scheduler (vc-scheduler, built from Volcano's Go module at the
pinned VOLCANO_VERSION) runs beside the default scheduler on the local control plane, with Volcano's CRDs,
and places the operator's workers (runPolicy.scheduling.gang.scheduler volcano) on the kwok-simulated GPU
pool. Volcano's controllers and webhooks are not run: the operator makes the PodGroup itself.

- The whole world or none of it: while another workload holds half the pool, no worker is bound and the
  job reports the timeout; once the GPUs are freed, every worker is bound and the job runs to its end.
- The queue is honoured: a Queue whose capability is below the world's GPUs keeps the PodGroup out of it
  (Pending) with the pool free, until the capability is raised.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed.gang_scheduler import VOLCANO_SCHEDULER_NAME, VolcanoScheduler, install_crd_file, volcano_dir
from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess, kubectl
from tests.integration.test_gang_scheduling import GPU, VOLCANO, free_gpus, n_workers, pod_group
from tests.integration.test_gang_scheduling import explained as gang_explained
from tests.integration.test_testbed import gpu_pod

pytestmark = pytest.mark.integration
RUN_5S = {"podAnnotations": {"sim.dtjob.io/run-duration": "5s"}}
RUNNING: list[VolcanoScheduler] = []  # the running scheduler, for its log in a failure's message


@pytest.fixture(scope="module")
def volcano(
    kubeconfig: str, simulated_pool: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VolcanoScheduler]:
    """Volcano's CRDs and its scheduler for this module's tests, once it has made Volcano's `default` Queue
    (its state stays unset: Volcano's queue controller writes it, and the scheduler does not read it)."""
    for crd in sorted((volcano_dir() / "crds").glob("*.yaml")):
        name = crd.name.removesuffix(".yaml")
        group, _, plural = name.partition("_")
        install_crd_file(kubeconfig, crd, f"{plural}.{group}")
    scheduler = VolcanoScheduler(kubeconfig, tmp_path_factory.mktemp("volcano"))
    scheduler.start()
    RUNNING[:] = [scheduler]
    try:
        wait_for(lambda: queue_exists(kubeconfig, "default"), timeout=60, what="Queue default")
        yield scheduler
    finally:
        scheduler.stop()


def queue_exists(kubeconfig: str, name: str) -> bool:
    return kubectl(kubeconfig, "get", "queues.scheduling.volcano.sh", name).returncode == 0


@pytest.fixture
def small_queue(api_client: client.ApiClient, volcano: VolcanoScheduler, namespace: str) -> Iterator[str]:
    """A Queue that may hold 8 GPUs at most: half the pool."""
    custom = client.CustomObjectsApi(api_client)
    name = f"small-{namespace}"
    body = {"apiVersion": "/".join(VOLCANO), "kind": "Queue", "metadata": {"name": name},
            "spec": {"weight": 1, "reclaimable": True, "capability": {GPU: "8"}}}  # fmt: skip
    custom.create_cluster_custom_object(*VOLCANO, "queues", body)
    try:
        yield name
    finally:
        try:
            custom.delete_cluster_custom_object(*VOLCANO, "queues", name)
        except ApiException as err:
            if err.status != 404:
                raise


def explained(
    jobs: Jobs, name: str, operator: OperatorProcess, api_client: client.ApiClient
) -> AbstractContextManager[None]:
    """A failed wait says what the job, its workers, its PodGroup, the operator and Volcano saw."""

    def group_status() -> str:
        group = pod_group(api_client, VOLCANO, jobs.ns, name)
        return f"PodGroup status: {(group or {}).get('status')}"

    return gang_explained(jobs, operator, name, RUNNING[0], group_status)


def bound_workers(jobs: Jobs, name: str) -> set[str]:
    return {str(p.metadata.name) for p in jobs.pods(name, "worker") if p.spec.node_name}


def timed_out(jobs: Jobs, name: str, bound: set[str]) -> dict[str, Any] | None:
    """GangScheduled once it says GangScheduleTimeout; each bound worker seen on the way goes in `bound`."""
    bound.update(bound_workers(jobs, name))
    cond = jobs.condition(name, "GangScheduled")
    return cond if cond and cond["reason"] == "GangScheduleTimeout" else None


def placed_and_done(jobs: Jobs, name: str) -> None:
    """Every worker bound, GangScheduled True naming Volcano, the job Succeeded, its PodGroup deleted."""
    wait_for(lambda: len(bound_workers(jobs, name)) == 4, timeout=90, what="every worker bound")
    placed = wait_for(
        lambda: (c := jobs.condition(name, "GangScheduled")) and c["status"] == "True" and c,
        timeout=60, what="GangScheduled True",
    )  # fmt: skip
    assert placed["message"] == f"all 4 workers placed together by {VOLCANO_SCHEDULER_NAME}", placed
    jobs.wait_phase(name, "Succeeded", timeout=120)
    launchers = jobs.pods(name, "launcher")
    assert launchers and all(p.spec.scheduler_name == VOLCANO_SCHEDULER_NAME for p in launchers)


def test_volcano_places_the_whole_world_or_none_of_it(
    jobs: Jobs, operator: OperatorProcess, volcano: VolcanoScheduler, core_v1: client.CoreV1Api,
    api_client: client.ApiClient, namespace: str,
) -> None:  # fmt: skip
    wait_for(lambda: free_gpus(core_v1) == 16, timeout=120, what="the 16 GPUs of the pool free")
    for i in range(2):  # another workload holds 8 of the 16 GPUs, placed by the default scheduler
        core_v1.create_namespaced_pod(namespace, gpu_pod(f"hog-{i}", 4))
    wait_for(lambda: free_gpus(core_v1) == 8, timeout=60, what="8 GPUs held by the other workload")
    gang = {"scheduler": "volcano", "scheduleTimeoutSeconds": 5}
    jobs.create("vc", workers=4, runPolicy={"scheduling": {"gang": gang}}, launcher=RUN_5S)
    workers = wait_for(lambda: n_workers(jobs, "vc", 4), timeout=60, what="4 workers")
    assert all(p.spec.scheduler_name == VOLCANO_SCHEDULER_NAME for p in workers)
    group = pod_group(api_client, VOLCANO, namespace, "vc")
    assert group["spec"]["minMember"] == 4 and group["spec"]["minResources"][GPU] == "16", group["spec"]

    # Volcano turns the whole world away: not one worker is bound while only half of it would fit.
    bound: set[str] = set()
    with explained(jobs, "vc", operator, api_client):
        cond = wait_for(lambda: timed_out(jobs, "vc", bound), timeout=90, interval=0.5, what="the timeout")
    assert bound == set(), f"bound while the world did not fit: {bound}"
    assert (
        cond["status"] == "False"
        and "runPolicy.scheduling.gang.scheduleTimeoutSeconds (5s)" in cond["message"]
    )
    # The launcher's pod, made with the world, stays held off every node (Volcano binds no gated pod).
    assert all(p.spec.scheduling_gates and not p.spec.node_name for p in jobs.pods("vc", "launcher"))
    assert free_gpus(core_v1) == 8
    verdict = pod_group(api_client, VOLCANO, namespace, "vc").get("status") or {}
    assert verdict.get("phase") in ("Pending", "Inqueue"), verdict  # Volcano's own: not Running

    # The other workload ends: Volcano binds the whole world, then the launcher.
    for i in range(2):
        core_v1.delete_namespaced_pod(f"hog-{i}", namespace, grace_period_seconds=0)
    with explained(jobs, "vc", operator, api_client):
        placed_and_done(jobs, "vc")


def test_a_volcano_queue_too_small_for_the_world_keeps_it_out(
    jobs: Jobs, operator: OperatorProcess, small_queue: str, core_v1: client.CoreV1Api,
    api_client: client.ApiClient, namespace: str,
) -> None:  # fmt: skip
    wait_for(lambda: free_gpus(core_v1) == 16, timeout=120, what="the 16 GPUs of the pool free")
    gang = {"scheduler": "volcano", "queue": small_queue, "scheduleTimeoutSeconds": 5}
    jobs.create("vq", workers=4, runPolicy={"scheduling": {"gang": gang}}, launcher=RUN_5S)
    group = wait_for(lambda: pod_group(api_client, VOLCANO, namespace, "vq"), timeout=60, what="PodGroup")
    assert group["spec"]["queue"] == small_queue

    # The pool has room for the world, its queue does not: Volcano keeps it out of the queue.
    bound: set[str] = set()
    with explained(jobs, "vq", operator, api_client):
        wait_for(lambda: timed_out(jobs, "vq", bound), timeout=90, interval=0.5, what="the timeout")
    assert bound == set(), f"bound beyond the queue's capability: {bound}"
    verdict = pod_group(api_client, VOLCANO, namespace, "vq").get("status") or {}
    assert verdict.get("phase") == "Pending", verdict
    assert free_gpus(core_v1) == 16

    # The cluster admin raises the queue's capability: the world goes in and runs.
    patch = {"spec": {"capability": {GPU: "16"}}}
    client.CustomObjectsApi(api_client).patch_cluster_custom_object(*VOLCANO, "queues", small_queue, patch)
    with explained(jobs, "vq", operator, api_client):
        placed_and_done(jobs, "vq")


def test_volcano_places_a_torchrun_world_whole_and_its_workers_end_it(
    jobs: Jobs, operator: OperatorProcess, volcano: VolcanoScheduler, core_v1: client.CoreV1Api,
    api_client: client.ApiClient, namespace: str,
) -> None:  # fmt: skip
    """A torchrun world has no launcher: its PodGroup is its workers, bound together, and the job ends when
    they all end 0."""
    wait_for(lambda: free_gpus(core_v1) == 16, timeout=120, what="the 16 GPUs of the pool free")
    gang = {"scheduler": "volcano", "scheduleTimeoutSeconds": 30}
    jobs.create("vt", workers=4, torchrun={}, runPolicy={"scheduling": {"gang": gang}})
    workers = wait_for(lambda: n_workers(jobs, "vt", 4), timeout=60, what="4 workers")
    assert all(p.spec.scheduler_name == VOLCANO_SCHEDULER_NAME for p in workers)
    group = pod_group(api_client, VOLCANO, namespace, "vt")
    assert group["spec"]["minMember"] == 4 and group["spec"]["minResources"][GPU] == "16", group["spec"]
    with explained(jobs, "vt", operator, api_client):
        wait_for(lambda: len(bound_workers(jobs, "vt")) == 4, timeout=90, what="every worker bound")
        running = jobs.wait_phase("vt", "Running", timeout=60)
    assert "16 ranks on 4 workers" in running["message"], running
    for pod in jobs.pods("vt", "worker"):
        jobs.annotate_pod(str(pod.metadata.name), {"sim.dtjob.io/outcome": "Succeeded"})
    done = jobs.wait_phase("vt", "Succeeded", "Failed", timeout=60)
    assert done["phase"] == "Succeeded" and not jobs.pods("vt", "launcher"), done
    placed = jobs.condition("vt", "GangScheduled")
    assert placed and placed["message"] == f"all 4 workers placed together by {VOLCANO_SCHEDULER_NAME}"
