"""Gang scheduling against real gang schedulers' APIs on the local control plane (kwok-simulated GPU pool):
scheduler-plugins' kube-scheduler with Coscheduling runs beside the default scheduler and places the
operator's workers all or none; Volcano's own PodGroup CRD judges the operator's Volcano PodGroup; a cluster
without the PodGroup API keeps the job waiting with a condition that names the API.

The default scheduler, for contrast, binds what fits (test_operator_fail_fast: four of five workers hold
their GPUs while the fifth never fits)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import pytest
from dtjob import desired
from dtjob.config import OperatorConfig
from dtjob.desired.common import owner_reference
from dtjob.kube.connect import ApiClient
from dtjob.spec.parse import parse_spec
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed.gang_scheduler import (
    COSCHEDULING_CRD,
    SCHEDULER_NAME,
    VOLCANO_CRD,
    CoschedulingScheduler,
    SchedulerProcess,
    coscheduling_crd_file,
    delete_crd,
    install_crd_file,
    volcano_crd_file,
)
from testbed.kube_wait import wait_for
from testbed.operator_harness import Jobs, OperatorProcess
from tests.integration.test_testbed import gpu_pod

pytestmark = pytest.mark.integration
GPU = "nvidia.com/gpu"
GPU_POOL = "kubernetes.azure.com/agentpool=gpu"
COSCHEDULING = ("scheduling.x-k8s.io", "v1alpha1")
VOLCANO = ("scheduling.volcano.sh", "v1beta1")
COSCHEDULER: list[CoschedulingScheduler] = []  # the running one, for its log in a failure's message


@pytest.fixture(scope="module")
def coscheduling(
    kubeconfig: str, simulated_pool: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The PodGroup CRD from the scheduler-plugins module and its kube-scheduler, running as a second
    scheduler for this module's tests; yields its schedulerName."""
    install_crd_file(kubeconfig, coscheduling_crd_file(), COSCHEDULING_CRD)
    scheduler = CoschedulingScheduler(kubeconfig, tmp_path_factory.mktemp("scheduler-plugins"))
    scheduler.start()
    COSCHEDULER[:] = [scheduler]
    try:
        yield SCHEDULER_NAME
    finally:
        scheduler.stop()


@pytest.fixture
def without_volcano(kubeconfig: str) -> Iterator[None]:
    """Volcano's CRD absent at the start of the test, and removed again at its end."""
    delete_crd(kubeconfig, VOLCANO_CRD)
    try:
        yield
    finally:
        delete_crd(kubeconfig, VOLCANO_CRD)


def free_gpus(core_v1: client.CoreV1Api) -> int:
    """nvidia.com/gpu on the simulated GPU pool not held by a pod that has not ended."""
    free = 0
    for node in core_v1.list_node(label_selector=f"{GPU_POOL},type=kwok").items:
        selector = f"spec.nodeName={node.metadata.name},status.phase!=Succeeded,status.phase!=Failed"
        raw: Any = core_v1.list_pod_for_all_namespaces(field_selector=selector, _preload_content=False)
        pods = json.loads(raw.data)["items"]
        held = sum(
            int(c.get("resources", {}).get("limits", {}).get(GPU, 0))
            for p in pods
            for c in p["spec"]["containers"]
        )
        free += int(node.status.allocatable.get(GPU, 0)) - held
    return free


@contextmanager
def explained(
    jobs: Jobs,
    operator: OperatorProcess,
    name: str = "gang",
    scheduler: SchedulerProcess | None = None,
    also: Callable[[], str] = str,
) -> Iterator[None]:
    """A failed wait says what the job `name`, its workers, the operator and the gang scheduler (coscheduling
    unless named) saw, and `also()`."""
    try:
        yield
    except AssertionError as err:
        verdicts = {
            p.metadata.name: (
                p.spec.node_name,
                [(c.type, c.status, c.message) for c in p.status.conditions or []],
            )
            for p in jobs.pods(name, "worker")
        }
        tail = (scheduler or COSCHEDULER[0]).log_tail(60)
        raise AssertionError(
            f"{err}\nstatus: {json.dumps(jobs.status(name), indent=1)}\nworkers: {verdicts}\n{also()}\n"
            f"operator log:\n{operator.log_tail(40)}\nscheduler log:\n{tail}"
        ) from None


def n_workers(jobs: Jobs, name: str, count: int) -> list[client.V1Pod] | None:
    pods = jobs.pods(name, "worker")
    return pods if len(pods) == count else None


def pod_group(api_client: client.ApiClient, api: tuple[str, str], namespace: str, name: str) -> Any:
    try:
        return client.CustomObjectsApi(api_client).get_namespaced_custom_object(
            *api, namespace, "podgroups", name
        )
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def test_a_gang_that_does_not_fit_binds_no_pod_until_the_gpus_are_freed(
    jobs: Jobs, operator: OperatorProcess, coscheduling: str, core_v1: client.CoreV1Api,
    api_client: client.ApiClient, namespace: str,
) -> None:  # fmt: skip
    wait_for(lambda: free_gpus(core_v1) == 16, timeout=120, what="the 16 GPUs of the pool free")
    # Another workload holds 8 of the pool's 16 GPUs; the gang asks for all 16.
    for i in range(2):  # another workload, placed by the default scheduler
        core_v1.create_namespaced_pod(namespace, gpu_pod(f"hog-{i}", 4))
    wait_for(lambda: free_gpus(core_v1) == 8, timeout=60, what="8 GPUs held by the other workload")
    gang = {"scheduler": "coscheduling", "scheduleTimeoutSeconds": 5}
    jobs.create("gang", workers=4, runPolicy={"scheduling": {"gang": gang}},
                launcher={"podAnnotations": {"sim.dtjob.io/run-duration": "5s"}})  # fmt: skip

    # The PodGroup exists, owned by the job and sized to the workers, before the workers do.
    group = wait_for(
        lambda: pod_group(api_client, COSCHEDULING, namespace, "gang"), timeout=60, what="PodGroup"
    )
    job_uid = (jobs.get("gang") or {})["metadata"]["uid"]
    assert [r["uid"] for r in group["metadata"]["ownerReferences"]] == [job_uid]
    assert group["spec"] == {"minMember": 4, "scheduleTimeoutSeconds": 5}
    workers = wait_for(lambda: n_workers(jobs, "gang", 4), timeout=60, what="4 workers")
    group_created = datetime.fromisoformat(group["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    for pod in workers:
        assert pod.spec.scheduler_name == coscheduling
        assert pod.metadata.labels["scheduling.x-k8s.io/pod-group"] == "gang"
        assert pod.metadata.creation_timestamp >= group_created

    # Coscheduling turns the whole gang away: not one worker is bound, no GPU is held by a partial world.
    bound: set[str] = set()

    def timed_out() -> dict[str, Any] | None:
        bound.update(str(p.metadata.name) for p in jobs.pods("gang", "worker") if p.spec.node_name)
        cond = jobs.condition("gang", "GangScheduled")
        return cond if cond and cond["reason"] == "GangScheduleTimeout" else None

    with explained(jobs, operator):
        cond = wait_for(timed_out, timeout=90, interval=0.5, what="GangScheduleTimeout")
    assert bound == set(), f"bound while the gang did not fit: {bound}"
    assert cond["status"] == "False"
    assert cond["message"].startswith(
        f"gang of 4 workers needs 16 {GPU} (4 per worker); 2 of 4 could be placed (8 {GPU} free on the "
        f"4 nodes matching {GPU_POOL}); not placed together within "
        "runPolicy.scheduling.gang.scheduleTimeoutSeconds (5s)"
    ), cond["message"]
    # Posted after the status patch that carries the condition: waited for, not listed at once.
    jobs.wait_event("gang", "GangScheduleTimeout")
    events = [e for e in jobs.events("gang") if e.reason == "GangScheduleTimeout"]
    assert [e.type for e in events] == ["Warning"] and events[0].message == cond["message"]
    status = jobs.status("gang")
    assert status["phase"] == "Pending" and status["message"] == cond["message"]
    # The scheduler looked at them and said no (the verdict is coscheduling's, not a silence).
    verdicts = [
        c for p in jobs.pods("gang", "worker") for c in p.status.conditions or []
        if c.type == "PodScheduled" and c.status == "False"
    ]  # fmt: skip
    assert verdicts, "no scheduling verdict on any worker"
    # The launcher pod came with the world; it is held off every node until the workers are Ready.
    held = jobs.pods("gang", "launcher")
    assert [p.metadata.name for p in held] == ["gang-launcher"]
    assert all(p.spec.scheduling_gates and not p.spec.node_name for p in held)
    assert free_gpus(core_v1) == 8

    # The other workload ends: the gang is placed at once, then the launcher (in the group, not counted).
    for i in range(2):
        core_v1.delete_namespaced_pod(f"hog-{i}", namespace, grace_period_seconds=0)
    with explained(jobs, operator):
        wait_for(lambda: all(p.spec.node_name for p in jobs.pods("gang", "worker")), timeout=90,
                 what="every worker bound")  # fmt: skip
    placed = wait_for(lambda: (c := jobs.condition("gang", "GangScheduled")) and c["status"] == "True" and c,
                      timeout=60, what="GangScheduled True")  # fmt: skip
    assert placed["message"] == f"all 4 workers placed together by {coscheduling}"
    jobs.wait_event("gang", "GangScheduled")
    jobs.wait_phase("gang", "Succeeded", timeout=120)
    launcher_pods = jobs.pods("gang", "launcher")
    assert launcher_pods and all(p.spec.scheduler_name == coscheduling for p in launcher_pods)
    # The job is done: its PodGroup goes with it.
    wait_for(lambda: pod_group(api_client, COSCHEDULING, namespace, "gang") is None, timeout=60,
             what="the PodGroup deleted")  # fmt: skip


def test_the_pod_group_is_what_the_coscheduling_crd_accepts_field_for_field(
    coscheduling: str, api_client: client.ApiClient, namespace: str
) -> None:
    check_strictly(api_client, COSCHEDULING, namespace, {"scheduler": "coscheduling"})


def check_strictly(
    api_client: client.ApiClient, api: tuple[str, str], namespace: str, gang: dict[str, Any]
) -> None:
    """The operator's PodGroup created with fieldValidation=Strict (every field known to the CRD's schema)
    and read back unchanged; a field the schema lacks is refused the same way (the check can fail)."""
    body = {
        "apiVersion": "dtjob.io/v1alpha1", "kind": "DistributedTrainingJob",
        "metadata": {"name": "strict", "namespace": namespace, "uid": "uid-1"},
        "spec": {"framework": "pytorch", "workers": 3, "gpusPerWorker": 4,
                 "worker": {"resources": {"requests": {"cpu": "1500m", "memory": "16Gi"}}},
                 "runPolicy": {"scheduling": {"gang": gang}}},
    }  # fmt: skip
    spec = parse_spec(body, OperatorConfig())
    group = desired.pod_group(spec, owner_reference("strict", "uid-1"), desired.worker_pod(spec, {}, 0, 0))
    group["metadata"].pop("ownerReferences")  # no such owner in the cluster
    custom = client.CustomObjectsApi(api_client)
    custom.create_namespaced_custom_object(*api, namespace, "podgroups", group, field_validation="Strict")
    stored = custom.get_namespaced_custom_object(*api, namespace, "podgroups", "strict")
    assert stored["spec"] == group["spec"]
    bogus = {**group, "metadata": {"name": "bogus"}, "spec": {**group["spec"], "minMembers": 3}}
    with pytest.raises(ApiException) as refused:
        custom.create_namespaced_custom_object(*api, namespace, "podgroups", bogus, field_validation="Strict")
    assert refused.value.status in (400, 422) and "minMembers" in str(refused.value.body)


def test_volcano_missing_then_installed_its_crd_judges_the_pod_group(
    jobs: Jobs, operator: OperatorProcess, without_volcano: None, kubeconfig: str,
    api_client: client.ApiClient, namespace: str, core_v1: client.CoreV1Api,
) -> None:  # fmt: skip
    gang = {"scheduler": "volcano", "queue": "research"}
    jobs.create("vc", workers=2, runPolicy={"scheduling": {"gang": gang}})
    cond = wait_for(lambda: (c := jobs.condition("vc", "Created")) and c["status"] == "False" and c,
                    timeout=60, what="Created False")  # fmt: skip
    assert cond["reason"] == "GangSchedulerMissing"
    assert cond["message"].startswith(
        "spec.runPolicy.scheduling.gang.scheduler volcano: the cluster does not serve PodGroup "
        "(scheduling.volcano.sh/v1beta1); install Volcano (its PodGroup CRD and scheduler)"
    ), cond["message"]
    assert jobs.status("vc")["phase"] == "Pending"
    jobs.wait_event("vc", "GangSchedulerMissing")
    # Nothing of the world exists meanwhile, and the operator keeps running (no crash loop).
    assert jobs.pods("vc") == [] and jobs.launcher("vc") is None
    assert [
        s.metadata.name
        for s in core_v1.list_namespaced_secret(namespace).items
        if s.metadata.name == "vc-ssh"
    ] == []
    assert operator.proc is not None and operator.proc.poll() is None

    # Volcano's own CRD (from its Go module) installed: the operator's next try creates the PodGroup, and
    # the API server, judging it by that CRD, stores it field for field.
    install_crd_file(kubeconfig, volcano_crd_file(), VOLCANO_CRD)
    group = wait_for(
        lambda: pod_group(api_client, VOLCANO, namespace, "vc"), timeout=90, what="Volcano PodGroup"
    )
    assert group["spec"] == {"minMember": 2, "queue": "research", "minResources": {GPU: "8"}}
    workers = wait_for(lambda: n_workers(jobs, "vc", 2), timeout=60, what="2 workers")
    for pod in workers:
        assert pod.spec.scheduler_name == "volcano"
        assert pod.metadata.annotations["scheduling.k8s.io/group-name"] == "vc"
    created = wait_for(lambda: (c := jobs.condition("vc", "Created")) and c["status"] == "True" and c,
                       timeout=60, what="Created True")  # fmt: skip
    assert created["reason"] == "WorldCreated"
    check_strictly(api_client, VOLCANO, namespace, {"scheduler": "volcano", "queue": "research"})


def test_a_pod_group_under_the_jobs_name_is_deleted_only_when_the_job_owns_it(
    coscheduling: str, api_client: client.ApiClient, operator_api: ApiClient, namespace: str
) -> None:
    """Before: the finished job's PodGroup was deleted by name, whoever owned the object of that name."""
    from dtjob.kube.client import KubeClient
    from dtjob.reconcile.deletes import delete_owned

    core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)

    def owner(
        name: str,
    ) -> client.V1ConfigMap:  # a real object, or the garbage collector takes its dependents
        return core.create_namespaced_config_map(
            namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name))
        )

    theirs, ours = owner("theirs"), owner("ours")
    for name, holder in (("shared", theirs), ("mine", ours)):
        ref = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": holder.metadata.name,
            "uid": holder.metadata.uid,
        }
        group = {
            "apiVersion": "/".join(COSCHEDULING), "kind": "PodGroup",
            "metadata": {"name": name, "ownerReferences": [ref]}, "spec": {"minMember": 1},
        }  # fmt: skip
        custom.create_namespaced_custom_object(*COSCHEDULING, namespace, "podgroups", group)
    kube = KubeClient(operator_api)
    api_version, our_uid = "/".join(COSCHEDULING), str(ours.metadata.uid)
    delete_owned(kube, "PodGroup", namespace, "shared", our_uid, api_version)
    assert custom.get_namespaced_custom_object(*COSCHEDULING, namespace, "podgroups", "shared")
    delete_owned(kube, "PodGroup", namespace, "mine", our_uid, api_version)
    with pytest.raises(ApiException) as gone:
        custom.get_namespaced_custom_object(*COSCHEDULING, namespace, "podgroups", "mine")
    assert gone.value.status == 404
    delete_owned(kube, "PodGroup", namespace, "mine", our_uid, api_version)  # already gone: nothing to do
