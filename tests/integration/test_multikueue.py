"""MultiKueue dispatch of DistributedTrainingJobs across two local control planes (testbed/multikueue.py): a
manager, where the job is created with spec.managedBy kueue.x-k8s.io/multikueue, and a worker, each with a
real Kueue and a dtjob operator.

- On the manager the operator creates only the job's Workload (owned by the job, its podSets the workers and
  the launcher, on the job's LocalQueue); MultiKueue copies it to the worker, and once the worker reserves
  quota, copies the job there (managedBy removed).
- The copy runs on the worker's simulated GPU pool, outside Kueue's pod groups (its Workload admitted it);
  nothing runs on the manager. The manager's job shows the copy's status, Running then Succeeded (or Failed),
  and its Workload finishes once the worker's operator marks the copy's Workload Finished (without that, the
  manager's Workload would hold its quota for good).
- A dispatched job deleted on the manager takes its Workload with it, and Kueue deletes the copy.
- A dispatched job that names no LocalQueue gets a Warning Event, no Workload and no status.
- A copy whose pods a LocalQueue named `default` on the worker takes (Kueue's LocalQueue defaulting) says why
  they wait, or, with quota for both, that it holds its quota twice, on the manager too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from testbed.kube_wait import wait_for
from testbed.kueue import KUEUE, KueueProcess, KueueRelease
from testbed.multikueue import (
    KUEUE_NAMESPACE,
    QUOTA,
    WORKER,
    WorkerCluster,
    manager_config,
    manager_objects,
    priority_class,
    queue_objects,
    workdir,
)
from testbed.operator_harness import Jobs, OperatorProcess, install_crd, kubectl
from tests.integration.test_kueue import gated

pytestmark = pytest.mark.integration

MULTIKUEUE = "kueue.x-k8s.io/multikueue"
PREBUILT = "kueue.x-k8s.io/prebuilt-workload-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
QUEUE = "team"
HIGH, HIGH_VALUE = "mk-high", 1000


@pytest.fixture(scope="module")
def worker_cluster(local_control_plane: Path) -> Iterator[WorkerCluster]:
    """A second local control plane beside the test's (skipped when the tests run against another cluster)."""
    cluster = WorkerCluster()
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def apply(kubeconfig: str, objects: list[dict[str, Any]]) -> None:
    """Applied, retried while the API server cannot reach Kueue's webhooks yet."""
    text = "\n---\n".join(json.dumps(o) for o in objects)

    def applied() -> bool:
        done = kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=text)
        return done.returncode == 0

    wait_for(applied, timeout=60, interval=1, what="Kueue's objects applied")


def delete(kubeconfig: str, objects: list[dict[str, Any]]) -> None:
    text = "\n---\n".join(json.dumps(o) for o in reversed(objects))
    kubectl(kubeconfig, "delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=text)


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    found = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in found if c["type"] == kind), {})


def get(api: client.ApiClient, plural: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
    custom = client.CustomObjectsApi(api)
    try:
        if namespace is None:
            return cast(dict[str, Any], custom.get_cluster_custom_object(*KUEUE, plural, name))
        return cast(dict[str, Any], custom.get_namespaced_custom_object(*KUEUE, namespace, plural, name))
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def active(api: client.ApiClient, plural: str, name: str, namespace: str | None = None) -> bool:
    return condition(get(api, plural, name, namespace), "Active").get("status") == "True"


@pytest.fixture
def worker(
    worker_cluster: WorkerCluster, namespace: str, tmp_path: Path, kueue_release: KueueRelease
) -> Iterator[Jobs]:
    """The worker: the CRD, the test's namespace, Kueue with the queue `team` and the WorkloadPriorityClass
    `HIGH`, a dtjob operator."""
    kubeconfig = worker_cluster.kubeconfig
    install_crd(kubeconfig)
    api: client.ApiClient = config.new_client_from_config(config_file=kubeconfig)
    core = client.CoreV1Api(api)
    labels = {"dtjob.io/test": "true"}
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace, labels=labels)))
    selector = {"kubernetes.io/metadata.name": namespace}
    kueue = KueueProcess(kubeconfig, workdir(tmp_path, "worker"), selector, release=kueue_release)
    operator = OperatorProcess(kubeconfig, namespace, tmp_path / "worker-operator.log")
    objects = [*queue_objects(namespace, QUEUE, []), priority_class(HIGH, HIGH_VALUE)]
    kueue.start()
    try:
        apply(kubeconfig, objects)
        queue_active = partial(active, api, "localqueues", QUEUE, namespace)
        wait_for(queue_active, timeout=60, what="the worker's LocalQueue Active")
        operator.start()
        yield Jobs(api, namespace)
    finally:
        operator.stop()
        delete(kubeconfig, objects)
        core.delete_namespace(namespace, propagation_policy="Background")
        kueue.stop()


@pytest.fixture
def manager(
    kubeconfig: str,
    namespace: str,
    tmp_path: Path,
    worker_cluster: WorkerCluster,
    worker: Jobs,
    jobs: Jobs,
    kueue_release: KueueRelease,
) -> Iterator[KueueProcess]:
    """The manager's Kueue with MultiKueue's adapter for the jobs, the worker (whose Kueue serves its kinds
    first: MultiKueue connects only then) as its MultiKueueCluster, and the queue `team` behind the MultiKueue
    admission check."""
    selector = {"kubernetes.io/metadata.name": namespace}
    kueue = KueueProcess(
        kubeconfig, workdir(tmp_path, "manager"), selector, manager_config(), release=kueue_release
    )
    objects = [
        *manager_objects(namespace, QUEUE, worker_cluster.flat_kubeconfig()),
        priority_class(HIGH, HIGH_VALUE),
    ]
    kueue.start()
    api: client.ApiClient = config.new_client_from_config(config_file=kubeconfig)
    try:
        apply(kubeconfig, objects)
        what = f"MultiKueueCluster connected ({kueue.log_path})"
        wait_for(partial(active, api, "multikueueclusters", WORKER), timeout=60, what=what)
        check = objects[3]["metadata"]["name"]
        wait_for(partial(active, api, "admissionchecks", check), timeout=60, what="admission check Active")
        wait_for(partial(active, api, "localqueues", QUEUE, namespace), timeout=60, what="LocalQueue Active")
        yield kueue
    finally:
        delete(kubeconfig, [o for o in objects if o["kind"] != "Secret"])
        kubectl(kubeconfig, "delete", "secret", "-n", KUEUE_NAMESPACE, WORKER, "--ignore-not-found")
        kueue.stop()


def _names(items: list[Any]) -> list[str]:
    return [str(i.metadata.name) for i in items]


def _nothing_on_the_manager(jobs: Jobs, name: str) -> None:
    selector = f"dtjob.io/job-name={name}"
    assert _names(jobs.core.list_namespaced_pod(jobs.ns, label_selector=selector).items) == []
    assert _names(jobs.core.list_namespaced_secret(jobs.ns, label_selector=selector).items) == []


def _dispatch(
    jobs: Jobs, name: str, launcher_cues: dict[str, str], priority: str | None = None
) -> dict[str, Any]:
    return jobs.create_labelled(
        name, {PRIORITY_CLASS_LABEL: priority} if priority else {},
        managedBy=MULTIKUEUE, workers=2, gpusPerWorker=1,
        runPolicy={"scheduling": {"queueName": QUEUE}, "backoffLimit": 0},
        launcher={"podAnnotations": launcher_cues},
    )  # fmt: skip


def _finished(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    """The Finished condition of the manager's Workload of job `name`, once there."""
    return wait_for(
        lambda: condition(get(api, "workloads", f"dtjob-{name}", namespace), "Finished") or None,
        timeout=60, what=f"the manager's Workload of {name} Finished",
    )  # fmt: skip


def _check_the_workload(api: client.ApiClient, job: dict[str, Any], log: Path) -> None:
    """The manager's Workload: the operator's only object, owned by the job, asking for its world."""
    meta = job["metadata"]
    found = partial(get, api, "workloads", f"dtjob-{meta['name']}", meta["namespace"])
    workload = wait_for(found, timeout=30, what=f"the manager's Workload ({log})")
    owner = workload["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("DistributedTrainingJob", meta["uid"], True)
    assert workload["spec"]["queueName"] == QUEUE
    pod_sets = {p["name"]: p for p in workload["spec"]["podSets"]}
    assert {name: p["count"] for name, p in pod_sets.items()} == {"worker": 2, "launcher": 1}
    worker_limits = pod_sets["worker"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert str(worker_limits["nvidia.com/gpu"]) == "1", worker_limits
    # The job's kueue.x-k8s.io/priority-class label: the class and its value, as Kueue gives its own jobs.
    assert workload["spec"]["priority"] == HIGH_VALUE, workload["spec"]
    ref = {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": HIGH}
    assert workload["spec"]["priorityClassRef"] == ref, workload["spec"]


def _check_the_copy(remote_jobs: Jobs, name: str, release: KueueRelease) -> None:
    """Kueue's copy on the worker: no managedBy, the prebuilt Workload's name (in a label, or from Kueue
    v0.18 in an annotation), its pods on the simulated pool and in no pod group of Kueue's."""
    remote_jobs.wait_phase(name, "Running", timeout=120)
    copy = remote_jobs.get(name) or {}
    assert "managedBy" not in copy["spec"]
    named_in = "annotations" if release.names_prebuilt_in_annotation else "labels"
    assert (copy["metadata"].get(named_in) or {}).get(PREBUILT) == f"dtjob-{name}", copy["metadata"]
    pods = remote_jobs.pods(name, "worker")
    assert len(pods) == 2 and all(p.spec.node_name and not p.spec.scheduling_gates for p in pods)
    assert not any("kueue.x-k8s.io/queue-name" in (p.metadata.labels or {}) for p in pods)


def test_a_dispatched_job_runs_on_the_worker_and_reports_on_the_manager(
    jobs: Jobs,
    operator: OperatorProcess,
    manager: KueueProcess,
    worker: Jobs,
    api_client: client.ApiClient,
    namespace: str,
    kueue_release: KueueRelease,
) -> None:
    remote = _dispatch(jobs, "remote", {"sim.dtjob.io/run-duration": "15s"}, HIGH)
    gone = _dispatch(jobs, "gone", {"sim.dtjob.io/run-duration": "600s"})
    _dispatch(jobs, "broken", {"sim.dtjob.io/outcome": "Failed", "sim.dtjob.io/exit-code": "3"})
    _check_the_workload(api_client, remote, operator.log_path)
    _check_the_copy(worker, "remote", kueue_release)
    admitted = get(api_client, "workloads", "dtjob-remote", namespace) or {}
    assert admitted["status"]["clusterName"] == WORKER, admitted["status"]
    assert [c["state"] for c in admitted["status"]["admissionChecks"]] == ["Ready"], admitted["status"]

    # The manager's job shows the worker's status; nothing of it runs there.
    jobs.wait_phase("remote", "Running", timeout=60)
    _nothing_on_the_manager(jobs, "remote")

    # A dispatched job deleted on the manager: its Workload goes with it, and Kueue deletes the copy.
    _check_the_copy(worker, "gone", kueue_release)
    jobs.delete(gone["metadata"]["name"])
    # The garbage collector (kube-controller-manager) acts on the owner's deletion, then Kueue (v0.15 retries
    # for about 15 s) lets the Workload go: on two cores shared by three test runs, the first step once took
    # 50 s alone.
    wait_for(lambda: get(api_client, "workloads", "dtjob-gone", namespace) is None, timeout=150,
             what="the deleted job's Workload gone (garbage collector)")  # fmt: skip
    wait_for(lambda: worker.get("gone") is None, timeout=90, what="the deleted job's copy gone (Kueue)")

    status = jobs.wait_phase("remote", "Succeeded", timeout=120)
    assert condition({"status": status}, "Succeeded").get("status") == "True", status
    assert status.get("restarts", 0) == 0 and status.get("completionTime"), status
    finished = _finished(api_client, namespace, "remote")
    assert finished["status"] == "True" and finished["reason"] == "Succeeded", finished
    _nothing_on_the_manager(jobs, "remote")

    # A copy that fails on the worker fails on the manager, with the worker's reason.
    status = jobs.wait_phase("broken", "Failed", timeout=60)
    assert condition({"status": status}, "Failed").get("status") == "True", status
    finished = _finished(api_client, namespace, "broken")
    assert finished["status"] == "True" and finished["reason"] == "Failed", finished
    _nothing_on_the_manager(jobs, "broken")
    _check_partial_admission(jobs, worker, api_client, namespace)


def _check_partial_admission(jobs: Jobs, worker: Jobs, api: client.ApiClient, namespace: str) -> None:
    """An elastic job asking for more GPUs than the queues hold: Kueue admits the workers that fit (partial
    admission, down to spec.elastic.minWorkers, the worker pod set's minCount) and the copy's world runs
    just those."""
    jobs.create(
        "wide", managedBy=MULTIKUEUE, workers=3, gpusPerWorker=4,  # 12 GPUs against a quota of 8
        elastic={"minWorkers": 1, "maxWorkers": 3},
        runPolicy={"scheduling": {"queueName": QUEUE}, "backoffLimit": 0},
        launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "10s"}},
    )  # fmt: skip
    worker.wait_phase("wide", "Running", timeout=120)
    copied = get(worker.custom.api_client, "workloads", "dtjob-wide", namespace) or {}
    pod_sets = {p["name"]: p for p in copied["spec"]["podSets"]}
    assert (pod_sets["worker"]["count"], pod_sets["worker"]["minCount"]) == (3, 1), pod_sets
    assigned = {a["name"]: a.get("count") for a in copied["status"]["admission"]["podSetAssignments"]}
    assert assigned["worker"] == 2, copied["status"]["admission"]
    pods = worker.live_workers("wide")
    assert sorted(str(p.metadata.name) for p in pods) == ["wide-worker-0", "wide-worker-1"]
    status = jobs.wait_phase("wide", "Succeeded", timeout=120)
    assert status.get("restarts", 0) == 0, status
    assert _finished(api, namespace, "wide")["reason"] == "Succeeded"


def test_a_copy_whose_pods_a_default_local_queue_takes_on_the_worker_says_so_on_the_manager(
    jobs: Jobs, operator: OperatorProcess, manager: KueueProcess, worker: Jobs, namespace: str
) -> None:
    """A copy's pods name no queue. A LocalQueue named `default` in the worker's namespace (Kueue's LocalQueue
    defaulting) takes them, each a Workload of its own asking again for the quota the copied Workload holds.
    With all of it held by the copy, they wait for good; with room for both, they run, the quota counted
    twice. Either way the copy says why, and the manager's job with it."""
    remote = worker.custom.api_client
    default = {"apiVersion": "/".join(KUEUE), "kind": "LocalQueue",
               "metadata": {"name": "default", "namespace": namespace},
               "spec": {"clusterQueue": f"cq-{namespace}"}}  # fmt: skip
    worker.custom.create_namespaced_custom_object(*KUEUE, namespace, "localqueues", default)
    wait_for(partial(active, remote, "localqueues", "default", namespace), timeout=60, what="default Active")
    _dispatch_taking(jobs, "twice", int(QUOTA["nvidia.com/gpu"]) // 2)  # two workers: the whole quota
    _wait_taken(worker, "twice", held=True)
    said = _manager_says(jobs, "twice", "LocalQueue named default")
    assert "the Workload MultiKueue copied here holds the job's quota" in said, said
    jobs.delete("twice")
    wait_for(lambda: not worker.pods("twice"), timeout=120, what="the gated copy's pods gone on the worker")

    _dispatch_taking(jobs, "once", int(QUOTA["nvidia.com/gpu"]) // 4)  # half the quota, twice over
    _wait_taken(worker, "once", held=False)
    said = _manager_says(jobs, "once", "a second time")
    assert said.startswith("training: ") and "counts 3 of its pods' quota a second time" in said, said
    assert jobs.status("once")["phase"] == "Running"
    jobs.delete("once")
    wait_for(lambda: not worker.pods("once"), timeout=120, what="the running copy's pods gone on the worker")


def _dispatch_taking(jobs: Jobs, name: str, gpus: int) -> None:
    jobs.create(
        name, managedBy=MULTIKUEUE, workers=2, gpusPerWorker=gpus,
        runPolicy={"scheduling": {"queueName": QUEUE}, "backoffLimit": 0},
        launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "600s"}},
    )  # fmt: skip


def _wait_taken(worker: Jobs, name: str, held: bool) -> None:
    """The copy's workers taken by the worker's LocalQueue default: gated (`held`), or admitted and Ready."""

    def taken() -> bool:
        pods = worker.pods(name, "worker")
        queues = {(p.metadata.labels or {}).get("kueue.x-k8s.io/queue-name") for p in pods}
        ready = all(gated(p) if held else bool(p.status and p.status.phase == "Running") for p in pods)
        return len(pods) == 2 and queues == {"default"} and ready

    state = "gated" if held else "running"
    wait_for(taken, timeout=120, what=f"{name}'s workers taken by the worker's LocalQueue default, {state}")


def _manager_says(jobs: Jobs, name: str, words: str) -> str:
    def says() -> str | None:
        message = str(jobs.status(name).get("message") or "")
        return message if words in message else None

    return wait_for(says, timeout=60, what=f"the manager's job {name} saying why: {words!r}")


def test_a_dispatched_job_without_a_queue_is_told_so(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create("lost", managedBy=MULTIKUEUE)

    def warned() -> list[str]:
        return [str(e.message) for e in jobs.events("lost") if e.reason == "NoQueue" and e.type == "Warning"]

    messages = wait_for(warned, timeout=30, what="the NoQueue Warning")
    assert "names no LocalQueue" in messages[0]
    assert jobs.status("lost") == {}
    try:
        workloads = jobs.custom.list_namespaced_custom_object(*KUEUE, jobs.ns, "workloads")["items"]
    except ApiException as err:
        assert err.status == 404, err  # Kueue's CRDs not installed: no Workload either
        workloads = []
    assert workloads == []
