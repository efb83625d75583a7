"""Jobs queued by a real Kueue (its manager built from sigs.k8s.io/kueue, its pod integration on, its webhooks
reached by the API server on loopback; testbed/kueue.py): a ClusterQueue with GPU quota for one job's world.

- A second job's workers exist but stay gated, bound to no node, until the first job finishes; then Kueue
  admits its world and it runs on the simulated GPU pool. The launcher is a member of its world's group: its
  pod stays after the job ends (its log), and the group's Workload still finishes, freeing the quota.
- A namespace's LocalQueue named `default` (Kueue's LocalQueue defaulting) takes no pod of a queued world:
  the world is one Workload on the job's own queue. A job that names no queue is queued there whole.
- A job whose spec.workers is edited while it waits for quota is admitted as one group of the new size.
- A job of higher priority preempts a running one: the preempted job shows Suspended (reason Preempted)
  without spending runPolicy.backoffLimit (0 here: one counted failure would fail it), and runs again once
  the quota is free.
- A suspended job (runPolicy.suspend) holds no quota until it is resumed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from typing import Any, cast

import pytest
from dtjob.gang import kueue as kq
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed.kube_wait import wait_for
from testbed.kueue import KUEUE, KueueProcess, KueueRelease, releases
from testbed.operator_harness import Jobs

pytestmark = pytest.mark.integration

QUEUE = "team"
GPUS_PER_WORLD = 2  # workers=2 x gpusPerWorker=1
LONG_LAUNCHER = {"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}}


# The label that puts a test's namespace under the module's Kueue (its pod webhook and its managed jobs).
KUEUE_NAMESPACE_LABEL = "dtjob.io/kueue-test"


@pytest.fixture(scope="module", params=releases(), ids=str)
def kueue_release(request: pytest.FixtureRequest) -> KueueRelease:
    """Each Kueue release, the module's tests grouped by it: one Kueue started per release, not per test."""
    return cast(KueueRelease, request.param)


@pytest.fixture(scope="module")
def kueue(
    kubeconfig: str, tmp_path_factory: pytest.TempPathFactory, kueue_release: KueueRelease
) -> Iterator[KueueProcess]:
    """One Kueue for the module's tests of a release. Each start registers Kueue's CRDs and their conversion
    webhook anew, which costs the API server more CPU than a test here; the tests share nothing else (each
    has its own namespace, ClusterQueue and LocalQueue)."""
    selector = {KUEUE_NAMESPACE_LABEL: kueue_release.version}
    proc = KueueProcess(kubeconfig, tmp_path_factory.mktemp("kueue"), selector, release=kueue_release)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def join_kueue(api_client: client.ApiClient, namespace: str, kueue: KueueProcess) -> None:
    """Put the test's namespace under the module's Kueue (its pod webhook and its managed jobs) by the label
    that Kueue selects namespaces by."""
    client.CoreV1Api(api_client).patch_namespace(namespace, {"metadata": {"labels": kueue.selector}})


@pytest.fixture
def queues(
    api_client: client.ApiClient, namespace: str, jobs: Jobs, kueue: KueueProcess
) -> Iterator[dict[str, str]]:
    """The test's namespace under the module's Kueue; a ResourceFlavor, a ClusterQueue with GPU quota for one
    world (preempting lower priorities), the LocalQueue `team` in the test's namespace and two
    WorkloadPriorityClasses; their names by role."""
    join_kueue(api_client, namespace, kueue)
    custom = client.CustomObjectsApi(api_client)
    group, version = KUEUE
    made = {k: f"{k}-{namespace}" for k in ("flavor", "cq", "low", "high")}
    cluster_objects: list[tuple[str, dict[str, Any]]] = [
        ("resourceflavors", {"metadata": {"name": made["flavor"]}, "spec": {}}),
        ("clusterqueues", {"metadata": {"name": made["cq"]}, "spec": {
            "namespaceSelector": {},
            "preemption": {"withinClusterQueue": "LowerPriority"},
            "resourceGroups": [{
                "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                "flavors": [{"name": made["flavor"], "resources": [
                    {"name": "cpu", "nominalQuota": "1000"},
                    {"name": "memory", "nominalQuota": "10000Gi"},
                    {"name": "nvidia.com/gpu", "nominalQuota": str(GPUS_PER_WORLD)},
                ]}],
            }],
        }}),
        ("workloadpriorityclasses", {"metadata": {"name": made["low"]}, "value": 10}),
        ("workloadpriorityclasses", {"metadata": {"name": made["high"]}, "value": 1000}),
    ]  # fmt: skip
    for plural, body in cluster_objects:
        kind = {"resourceflavors": "ResourceFlavor", "clusterqueues": "ClusterQueue"}.get(
            plural, "WorkloadPriorityClass"
        )
        obj = {"apiVersion": "/".join(KUEUE), "kind": kind, **body}
        # The first writes may find the API server not yet through to Kueue's conversion webhook: retried.
        create = partial(custom.create_cluster_custom_object, group, version, plural, obj)
        wait_for(partial(created, create), timeout=30, what=f"{kind} created")
    local = {"apiVersion": "/".join(KUEUE), "kind": "LocalQueue", "metadata": {"name": QUEUE},
             "spec": {"clusterQueue": made["cq"]}}  # fmt: skip
    custom.create_namespaced_custom_object(group, version, namespace, "localqueues", local)
    wait_queues_active(custom, namespace, made["cq"], QUEUE, kueue)
    try:
        yield made
    finally:
        for plural, body in reversed(cluster_objects):
            try:
                custom.delete_cluster_custom_object(group, version, plural, body["metadata"]["name"])
            except ApiException as err:
                if err.status != 404:
                    raise


def wait_queues_active(
    custom: client.CustomObjectsApi, namespace: str, cluster_queue: str, local_queue: str, kueue: KueueProcess
) -> None:
    """Waits until Kueue calls both queues Active. A workload that arrives before Kueue has seen the
    LocalQueue is judged Inadmissible ("LocalQueue ... doesn't exist") until a later pass, so a test that
    reads Kueue's first verdict must not start earlier."""

    def active(get: Any) -> bool:
        return bool(condition(cast(dict[str, Any], get()), "Active").get("status") == "True")

    cq = partial(custom.get_cluster_custom_object, *KUEUE, "clusterqueues", cluster_queue)
    wait_for(partial(active, cq), timeout=60, what=f"ClusterQueue {cluster_queue} Active ({kueue.log_path})")
    lq = partial(custom.get_namespaced_custom_object, *KUEUE, namespace, "localqueues", local_queue)
    wait_for(partial(active, lq), timeout=60, what=f"LocalQueue {local_queue} Active ({kueue.log_path})")


def created(create: Any) -> bool:
    try:
        create()
    except ApiException as err:
        if err.status == 500 and "conversion webhook" in str(err.body):
            return False
        raise
    return True


def world(priority: str | None = None, **spec: Any) -> dict[str, Any]:
    labels = {"kueue.x-k8s.io/priority-class": priority} if priority else {}
    return {
        "workers": 2, "gpusPerWorker": 1,
        "worker": {"podLabels": labels},
        "runPolicy": {"scheduling": {"queueName": QUEUE}, "backoffLimit": 0},
        **spec,
    }  # fmt: skip


def gated(pod: client.V1Pod) -> bool:
    return any(g.name == kq.ADMISSION_GATE for g in pod.spec.scheduling_gates or [])


def workload(api_client: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    custom = client.CustomObjectsApi(api_client)
    try:
        found = custom.get_namespaced_custom_object(*KUEUE, namespace, "workloads", name)
        return cast(dict[str, Any], found)
    except ApiException as err:
        if err.status == 404:
            return {}
        raise


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def test_a_second_job_waits_gated_until_the_first_finishes(
    jobs: Jobs, operator: Any, queues: dict[str, str], api_client: client.ApiClient, namespace: str
) -> None:
    jobs.create("first", **world(launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "20s"}}))
    jobs.wait_phase("first", "Running", timeout=120)
    admitted = workload(api_client, namespace, "first")
    assert condition(admitted, "Admitted").get("status") == "True", admitted
    # One Workload for the world: the workers' PodSet and the launcher's.
    assert sorted(ps["count"] for ps in admitted["spec"]["podSets"]) == [1, 2], admitted["spec"]["podSets"]
    assert {p.metadata.labels[kq.POD_GROUP_NAME_LABEL] for p in jobs.pods("first")} == {"first"}
    assert all(p.spec.node_name for p in jobs.pods("first", "worker"))

    jobs.create("second", **world())

    def waiting() -> bool:
        pods = jobs.pods("second", "worker")
        reserved = condition(workload(api_client, namespace, "second"), "QuotaReserved")
        return len(pods) == 2 and reserved.get("status") == "False"

    wait_for(waiting, timeout=60, what="second's workers created and its Workload waiting for quota")
    pods = jobs.pods("second", "worker")
    assert all(gated(p) and not p.spec.node_name for p in pods), [p.spec for p in pods]
    assert jobs.status("first")["phase"] == "Running"

    def says_why() -> bool:
        status = jobs.status("second")
        return status.get("phase") == "Pending" and "wait for admission by Kueue" in status.get("message", "")

    wait_for(says_why, timeout=30, what="second Pending, saying its workers wait for admission by Kueue")
    assert jobs.status("first")["phase"] == "Running"

    jobs.wait_phase("first", "Succeeded", timeout=120)

    # Its launcher pod stays, marked so that Kueue finishes the group with no pod of it active (the status is
    # recorded before the actions it decides, so the mark may follow the phase by a moment).
    def marked() -> bool:
        kept = jobs.launcher("first")
        assert kept is not None and kept.status.phase == "Succeeded"
        return (kept.metadata.annotations or {}).get(kq.RETRIABLE_IN_GROUP) == kq.NOT_RETRIABLE

    wait_for(marked, timeout=30, what="first's kept launcher marked not retriable in its Kueue group")
    jobs.wait_phase("second", "Running", timeout=120)
    assert condition(workload(api_client, namespace, "first"), "Finished").get("status") == "True"
    pods = jobs.pods("second", "worker")
    assert all(not gated(p) and p.spec.node_name for p in pods)
    jobs.wait_phase("second", "Succeeded", timeout=120)
    assert jobs.status("second").get("restarts", 0) == 0


def test_a_job_edited_to_fewer_workers_while_it_waits_is_admitted_as_one_group_of_the_new_size(
    jobs: Jobs, operator: Any, queues: dict[str, str], api_client: client.ApiClient, namespace: str
) -> None:
    """Kueue makes no Workload of a pod group whose pods disagree on its size. A job whose spec.workers is
    edited while its world waits for quota gets its gated workers made again in one group of the new size,
    and runs once the quota is free."""
    jobs.create("first", **world(launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "40s"}}))
    jobs.wait_phase("first", "Running", timeout=120)
    jobs.create("edited", **world(launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "5s"}}))
    wait_for(
        lambda: len(pods := jobs.pods("edited")) == 3 and all(gated(p) for p in pods),
        timeout=60, what="edited's world made (two workers, a launcher) and gated",
    )  # fmt: skip
    jobs.patch_spec("edited", {"workers": 1})

    def regrouped() -> bool:
        counts = {
            str(p.metadata.name): str((p.metadata.annotations or {}).get(kq.POD_GROUP_TOTAL_COUNT))
            for p in jobs.pods("edited")
            if not p.metadata.deletion_timestamp
        }
        return counts == {"edited-launcher": "2", "edited-worker-0": "2"}

    wait_for(regrouped, timeout=60, what="edited's world: one worker and its launcher, one group of 2")
    jobs.wait_phase("first", "Succeeded", timeout=120)
    jobs.wait_phase("edited", "Running", "Succeeded", timeout=120)
    admitted = workload(api_client, namespace, "edited")
    assert sorted(ps["count"] for ps in admitted["spec"]["podSets"]) == [1, 1], admitted["spec"]["podSets"]
    status = jobs.wait_phase("edited", "Succeeded", timeout=120)
    assert status.get("restarts", 0) == 0, status


def test_a_higher_priority_job_preempts_without_spending_the_backoff_limit(
    jobs: Jobs, operator: Any, queues: dict[str, str], api_client: client.ApiClient, namespace: str
) -> None:
    jobs.create("low", **world(queues["low"], launcher=LONG_LAUNCHER))
    jobs.wait_phase("low", "Running", timeout=120)
    jobs.create(
        "high", **world(queues["high"], launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "15s"}})
    )

    status = jobs.wait_phase("low", "Suspended", timeout=120)
    suspended = jobs.condition("low", "Suspended") or {}
    assert suspended.get("status") == "True" and suspended.get("reason") == "Preempted", status
    assert "Preempted" in suspended["message"]
    assert status.get("restarts", 0) == 0
    jobs.wait_phase("high", "Running", timeout=120)

    # While the higher priority runs, the preempted world is back, gated, waiting for the quota.
    def regated() -> bool:
        pods = jobs.live_workers("low")
        return len(pods) == 2 and all(gated(p) and not p.spec.node_name for p in pods)

    wait_for(regated, timeout=60, what="low's workers created again and gated")
    jobs.wait_phase("high", "Succeeded", timeout=120)
    status = jobs.wait_phase("low", "Running", timeout=120)
    assert status.get("restarts", 0) == 0, status
    resumed = jobs.condition("low", "Suspended") or {}
    assert resumed.get("status") == "False" and resumed.get("reason") == "Admitted", resumed
    jobs.wait_event("low", "Admitted")  # events go after the status patch they belong to
    reasons = [e.reason for e in jobs.events("low")]
    assert "Preempted" in reasons and "Admitted" in reasons, reasons


def test_an_elastic_worlds_lost_worker_is_replaced_on_the_quota_the_group_holds(
    jobs: Jobs, operator: Any, queues: dict[str, str], api_client: client.ApiClient, namespace: str
) -> None:
    """Kueue serves its elastic Workloads (workload slices) to none of the kinds a dtjob world is: a pod group
    keeps the size it was admitted with. A worker lost from an elastic world leaves its share reserved, and
    its replacement joins the admitted group at once (no new admission, no counted restart)."""
    jobs.create("el", **world(elastic={"minWorkers": 1, "maxWorkers": 2}, launcher=LONG_LAUNCHER))
    jobs.wait_phase("el", "Running", timeout=120)
    admitted = workload(api_client, namespace, "el")
    assert condition(admitted, "Admitted").get("status") == "True", admitted
    assert gpus_reserved(client.CustomObjectsApi(api_client), queues["cq"]) == str(GPUS_PER_WORLD)
    lost = next(p for p in jobs.live_workers("el") if p.metadata.name == "el-worker-1")
    jobs.core.delete_namespaced_pod("el-worker-1", namespace, grace_period_seconds=0)

    def replaced() -> client.V1Pod | None:
        pods = [p for p in jobs.live_workers("el") if p.metadata.name == "el-worker-1"]
        fresh = [p for p in pods if p.metadata.uid != lost.metadata.uid]
        return fresh[0] if fresh and fresh[0].spec.node_name and not gated(fresh[0]) else None

    wait_for(replaced, timeout=90, what="el-worker-1 replaced, ungated and bound")
    _runs_on_its_admission(jobs, "el", admitted, queues["cq"])


def test_an_elastic_world_kueue_admitted_keeps_its_size_when_spec_workers_is_edited(
    jobs: Jobs, operator: Any, queues: dict[str, str], api_client: client.ApiClient, namespace: str
) -> None:
    """Kueue has no elastic pod groups: a member made for a group of another size is deleted. An admitted
    elastic world edited to one worker more made that worker again every few seconds, for good; it now keeps
    the size Kueue admitted, and says that the edit applies at its next world."""
    jobs.create("grow", **world(elastic={"minWorkers": 1, "maxWorkers": 3}, launcher=LONG_LAUNCHER))
    jobs.wait_phase("grow", "Running", timeout=120)
    admitted = workload(api_client, namespace, "grow")
    jobs.patch_spec("grow", {"workers": 3})

    def says_it_waits() -> str | None:
        message = str(jobs.status("grow").get("message") or "")
        return message if "spec.workers=3 applies at the next world" in message else None

    said = wait_for(says_it_waits, timeout=60, what="the edit said to wait for the next world")
    assert said.endswith("Kueue admitted this one at 2)"), said
    time.sleep(10)  # where the edit was taken, Kueue deleted the third worker and it came back within this
    made = {str(p.metadata.name) for p in jobs.pods("grow", "worker")}
    assert made == {"grow-worker-0", "grow-worker-1"}, made
    _runs_on_its_admission(jobs, "grow", admitted, queues["cq"])


def _runs_on_its_admission(jobs: Jobs, name: str, admitted: dict[str, Any], cluster_queue: str) -> None:
    """The job runs, unrestarted, on the Workload Kueue first admitted, with the quota of one world."""
    status = jobs.status(name)
    assert status["phase"] == "Running" and status.get("restarts", 0) == 0, status
    after = workload(jobs.custom.api_client, jobs.ns, name)
    assert after["metadata"]["uid"] == admitted["metadata"]["uid"], "the group was admitted anew"
    assert condition(after, "Admitted").get("status") == "True", after
    assert gpus_reserved(jobs.custom, cluster_queue) == str(GPUS_PER_WORLD)


def gpus_reserved(custom: client.CustomObjectsApi, cluster_queue: str) -> str:
    """The GPUs the ClusterQueue's admitted Workloads hold (Kueue's own count)."""
    found = cast(dict[str, Any], custom.get_cluster_custom_object(*KUEUE, "clusterqueues", cluster_queue))
    for flavor in (found.get("status") or {}).get("flavorsReservation") or []:
        for resource in flavor.get("resources") or []:
            if resource["name"] == "nvidia.com/gpu":
                return str(resource["total"])
    return "0"


def test_a_torchrun_world_is_admitted_as_its_workers_alone_and_frees_the_quota_as_they_end(
    jobs: Jobs, operator: Any, queues: dict[str, str], api_client: client.ApiClient, namespace: str
) -> None:
    """A torchrun job has no launcher: Kueue's pod group is its two workers, admitted whole; the job succeeds
    when both end 0, and the quota they held goes to the next job."""
    jobs.create("ddp-first", **world(torchrun={}))
    jobs.wait_phase("ddp-first", "Running", timeout=120)
    pods = jobs.pods("ddp-first")
    assert {p.metadata.labels["dtjob.io/role"] for p in pods} == {"worker"}, [p.metadata.name for p in pods]
    assert {p.metadata.annotations[kq.POD_GROUP_TOTAL_COUNT] for p in pods} == {"2"}
    assert condition(workload(api_client, namespace, "ddp-first"), "Admitted").get("status") == "True"

    jobs.create("ddp-second", **world(torchrun={}))
    wait_for(
        lambda: len(waiting := jobs.pods("ddp-second", "worker")) == 2 and all(gated(p) for p in waiting),
        timeout=60, what="ddp-second's workers gated, waiting for ddp-first's quota",
    )  # fmt: skip
    for pod in jobs.pods("ddp-first", "worker"):  # both torchrun agents exit 0
        jobs.annotate_pod(str(pod.metadata.name), {"sim.dtjob.io/outcome": "Succeeded"})
    first = jobs.wait_phase("ddp-first", "Succeeded", "Failed", timeout=60)
    assert condition({"status": first}, "Succeeded").get("reason") == "WorkersSucceeded", first
    jobs.wait_phase("ddp-second", "Running", timeout=120)
    assert jobs.status("ddp-second").get("restarts", 0) == 0


def test_a_namespaces_default_local_queue_takes_no_pod_of_a_queued_world(
    jobs: Jobs, operator: Any, queues: dict[str, str], api_client: client.ApiClient, namespace: str,
    kueue: KueueProcess,
) -> None:  # fmt: skip
    """Kueue puts every pod that names no queue in its namespace's LocalQueue `default`, if there is one
    (LocalQueue defaulting: on by default from v0.12, always from v0.19). A launcher outside its world's group
    would be a Workload of its own there, admitted, and preempted, apart from its workers."""
    custom = client.CustomObjectsApi(api_client)
    default = {"apiVersion": "/".join(KUEUE), "kind": "LocalQueue", "metadata": {"name": "default"},
               "spec": {"clusterQueue": queues["cq"]}}  # fmt: skip
    custom.create_namespaced_custom_object(*KUEUE, namespace, "localqueues", default)
    wait_queues_active(custom, namespace, queues["cq"], "default", kueue)
    jobs.create("dq", **world(launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "10s"}}))
    jobs.wait_phase("dq", "Running", timeout=120)
    launcher = jobs.launcher("dq")
    assert launcher is not None and launcher.metadata.labels[kq.QUEUE_NAME_LABEL] == QUEUE
    found = custom.list_namespaced_custom_object(*KUEUE, namespace, "workloads")["items"]
    assert [(w["metadata"]["name"], w["spec"]["queueName"]) for w in found] == [("dq", QUEUE)], found
    assert sum(ps["count"] for ps in found[0]["spec"]["podSets"]) == 3
    jobs.wait_phase("dq", "Succeeded", timeout=120)
    wait_for(
        lambda: condition(workload(api_client, namespace, "dq"), "Finished").get("status") == "True",
        timeout=60, what="the world's Workload Finished once the job ended",
    )  # fmt: skip
    # The ClusterQueue's status says so at its next update.
    wait_for(lambda: gpus_reserved(custom, queues["cq"]) == "0", timeout=30, what="no GPU reserved")


def test_jobs_that_name_no_queue_are_queued_whole_by_the_namespaces_default_local_queue(
    jobs: Jobs, operator: Any, queues: dict[str, str], api_client: client.ApiClient, namespace: str,
    kueue: KueueProcess,
) -> None:  # fmt: skip
    """Kueue's LocalQueue defaulting puts a job that names no queue in the namespace's LocalQueue `default`.
    Every world is one pod group, so each job is one Workload there, launcher included, never a Workload per
    pod (which could admit a worker of each job against quota for one world, and start neither). Two jobs
    made together on quota for one world run one after the other, each admitted whole."""
    custom = client.CustomObjectsApi(api_client)
    default = {"apiVersion": "/".join(KUEUE), "kind": "LocalQueue", "metadata": {"name": "default"},
               "spec": {"clusterQueue": queues["cq"]}}  # fmt: skip
    custom.create_namespaced_custom_object(*KUEUE, namespace, "localqueues", default)
    wait_queues_active(custom, namespace, queues["cq"], "default", kueue)
    short = {"podAnnotations": {"sim.dtjob.io/run-duration": "10s"}}
    for name in ("na", "nb"):
        jobs.create(name, **world(launcher=short, runPolicy={"backoffLimit": 0}))

    def both_queued() -> list[tuple[str, str, int]]:
        found = custom.list_namespaced_custom_object(*KUEUE, namespace, "workloads")["items"]
        return sorted(
            (w["metadata"]["name"], w["spec"]["queueName"], sum(ps["count"] for ps in w["spec"]["podSets"]))
            for w in found
        )

    def finished(name: str) -> bool:
        return bool(condition(workload(api_client, namespace, name), "Finished").get("status") == "True")

    wait_for(lambda: len(both_queued()) == 2, timeout=60, what="a Workload for each job")
    assert both_queued() == [("na", "default", 3), ("nb", "default", 3)]
    for name in ("na", "nb"):
        jobs.wait_phase(name, "Succeeded", timeout=180)
        wait_for(partial(finished, name), timeout=60, what=f"{name}'s Workload Finished once the job ended")
    assert both_queued() == [("na", "default", 3), ("nb", "default", 3)]  # no Workload of a single pod
    wait_for(lambda: gpus_reserved(custom, queues["cq"]) == "0", timeout=30, what="no GPU reserved")


def test_a_suspended_job_frees_its_quota_and_runs_again_when_resumed(
    jobs: Jobs, operator: Any, queues: dict[str, str], api_client: client.ApiClient, namespace: str
) -> None:
    """runPolicy.suspend deletes the world and makes none in its place: the operator takes Kueue's finalizer
    off the ended pods, so that the group's Workload goes with them and its quota is free while the job
    waits."""
    custom = client.CustomObjectsApi(api_client)
    jobs.create("pause", **world(launcher=LONG_LAUNCHER))
    jobs.wait_phase("pause", "Running", timeout=120)
    assert gpus_reserved(custom, queues["cq"]) == str(GPUS_PER_WORLD)
    jobs.patch_spec("pause", {"runPolicy": {"suspend": True}})
    jobs.wait_phase("pause", "Suspended", timeout=60)
    wait_for(lambda: jobs.pods("pause") == [], timeout=60, what="the suspended world's pods gone")
    wait_for(lambda: gpus_reserved(custom, queues["cq"]) == "0", timeout=60, what="its quota free")
    jobs.patch_spec("pause", {"runPolicy": {"suspend": False}})
    status = jobs.wait_phase("pause", "Running", timeout=120)
    assert gpus_reserved(custom, queues["cq"]) == str(GPUS_PER_WORLD), status
