"""Gang scheduling's pure parts: runPolicy.scheduling.gang parsed, the PodGroup of each scheduler and how the
pods join it, the PodGroup's drift, GangScheduled and the timeout's shortfall, and the exact calls of a
reconcile (the PodGroup before anything else; a cluster without its API gets nothing and a clear condition).
The real schedulers judge the same objects in tests/integration/test_gang_scheduling.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from dtjob import desired
from dtjob.desired.common import owner_reference
from dtjob.desired.owned import drift
from dtjob.gang import PoolRoom, pool_room
from dtjob.gang.placement import shortfall
from dtjob.gang.pool_room import pod_view
from dtjob.gang.resources import min_resources
from dtjob.machine import decide
from dtjob.machine.gang import wants_pool_room
from dtjob.reconcile.job import reconcile
from dtjob.reconcile.observe import _pool_room
from dtjob.spec.parse import JobSpec, SpecError
from dtjob.state.decision import DeletePodGroup, EnsureWorld
from dtjob.state.observed import Children, Observed, PodState
from dtjob.state.status import JobStatus
from dtjob.timefmt import format_time

from tests.unit.operator_fixtures import CONFIG, job_spec
from tests.unit.recording_kube import JOB_KIND, RecordingKube
from tests.unit.test_reconcile_calls import new_job

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
OWNER = owner_reference("rn50", "uid-1")
COSCHEDULING_GANG = {"scheduler": "coscheduling", "scheduleTimeoutSeconds": 30}
COSCHEDULING = {"runPolicy": {"scheduling": {"gang": COSCHEDULING_GANG}}}
VOLCANO = {"runPolicy": {"scheduling": {"gang": {"scheduler": "volcano", "queue": "research"}}}}


def gang_spec(gang: dict[str, Any], **spec: Any) -> JobSpec:
    return job_spec(runPolicy={"scheduling": {"gang": gang}}, **spec)


# --- the spec ----------------------------------------------------------------------------------------------


def test_gang_defaults_to_a_sixty_second_timeout() -> None:
    gang = gang_spec({"scheduler": "coscheduling"}).run_policy.scheduling.gang
    assert gang is not None and (gang.scheduler, gang.schedule_timeout_seconds, gang.queue) == (
        "coscheduling", 60, None
    )  # fmt: skip


@pytest.mark.parametrize(
    ("scheduling", "field", "words"),
    [
        ({"gang": {}}, "spec.runPolicy.scheduling.gang.scheduler", "is required"),
        ({"gang": {"scheduler": "kueue"}}, "spec.runPolicy.scheduling.gang.scheduler", "one of coscheduling"),
        ({"gang": {"scheduler": "coscheduling", "queue": "q"}}, "spec.runPolicy.scheduling.gang.queue",
         "only with scheduler volcano"),
        ({"gang": {"scheduler": "volcano", "scheduleTimeoutSeconds": 0}},
         "spec.runPolicy.scheduling.gang.scheduleTimeoutSeconds", ">= 1"),
        ({"gang": {"scheduler": "volcano", "queue": "Not_A_Name"}}, "spec.runPolicy.scheduling.gang.queue",
         "DNS"),
        ({"gang": {"scheduler": "volcano"}, "podGroup": "mine"}, "spec.runPolicy.scheduling.podGroup",
         "set one of them"),
    ],
)  # fmt: skip
def test_a_gang_the_operator_cannot_run_names_its_field(
    scheduling: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(SpecError) as err:
        job_spec(runPolicy={"scheduling": scheduling})
    assert err.value.path == field and words in err.value.message


@pytest.mark.parametrize("pod", ["worker", "launcher"])
def test_a_template_may_not_send_the_gang_to_another_scheduler(pod: str) -> None:
    with pytest.raises(SpecError) as err:
        job_spec(**{pod: {"template": {"spec": {"schedulerName": "default-scheduler"}}}}, **VOLCANO)
    assert err.value.path == f"spec.{pod}.template.spec.schedulerName"
    assert "set spec.runPolicy.scheduling.schedulerName instead" in err.value.message
    # Without a gang the template's scheduler is the template's business.
    job_spec(**{pod: {"template": {"spec": {"schedulerName": "default-scheduler"}}}})


# --- the PodGroups and the pods ----------------------------------------------------------------------------


def test_the_coscheduling_pod_group_counts_the_workers_and_carries_the_timeout() -> None:
    spec = job_spec(workers=4, **COSCHEDULING)
    group = desired.pod_group(spec, OWNER, desired.worker_pod(spec, OWNER, 0, 0))
    assert group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1" and group["kind"] == "PodGroup"
    assert group["metadata"]["name"] == "rn50" and group["metadata"]["ownerReferences"] == [OWNER]
    # The launcher is created only once the workers are Ready: it is not counted, nor are its resources.
    assert group["spec"] == {"minMember": 4, "scheduleTimeoutSeconds": 30}
    worker = desired.worker_pod(spec, OWNER, 2, 0)
    launcher = desired.launcher_pod(spec, OWNER, 0)
    for pod in (worker, launcher):
        assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "rn50"
        assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
        assert "scheduling.k8s.io/group-name" not in (pod["metadata"].get("annotations") or {})


def test_the_volcano_pod_group_asks_its_queue_for_the_workers_resources() -> None:
    requests = {"cpu": "500m", "memory": "16Gi"}
    spec = job_spec(workers=3, worker={"resources": {"requests": requests}}, **VOLCANO)
    group = desired.pod_group(spec, OWNER, desired.worker_pod(spec, OWNER, 0, 0))
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["spec"] == {
        "minMember": 3,
        "queue": "research",
        "minResources": {"cpu": "1500m", "memory": "48Gi", "nvidia.com/gpu": "12"},
    }
    launcher = desired.launcher_pod(spec, OWNER, 0)
    for pod in (desired.worker_pod(spec, OWNER, 0, 0), launcher):
        assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "rn50"
        assert pod["spec"]["schedulerName"] == "volcano"
        assert "scheduling.x-k8s.io/pod-group" not in pod["metadata"]["labels"]


def test_the_specs_scheduler_name_wins_and_user_annotations_stay() -> None:
    spec = job_spec(
        worker={"podAnnotations": {"team": "vision"}},
        runPolicy={"scheduling": {"schedulerName": "gang-b", "gang": {"scheduler": "volcano"}}},
    )
    pod = desired.worker_pod(spec, OWNER, 0, 0)
    assert pod["spec"]["schedulerName"] == "gang-b"
    assert pod["metadata"]["annotations"] == {
        "team": "vision",
        "scheduling.k8s.io/group-name": "rn50",
        "kueue.x-k8s.io/pod-group-total-count": "3",
    }
    assert "queue" not in desired.pod_group(spec, OWNER, pod)["spec"]  # Volcano's default queue


def test_without_a_gang_nothing_changes() -> None:
    pod = desired.worker_pod(job_spec(), OWNER, 0, 0)
    assert "schedulerName" not in pod["spec"]
    assert pod["metadata"]["annotations"] == {"kueue.x-k8s.io/pod-group-total-count": "3"}  # Kueue's only
    assert not any(key.startswith("scheduling") for key in pod["metadata"]["labels"])


@pytest.mark.parametrize(
    ("containers", "count", "expected"),
    [
        ([{"limits": {"nvidia.com/gpu": "4"}}], 4, {"nvidia.com/gpu": "16"}),
        ([{"limits": {"cpu": "2"}, "requests": {"cpu": "250m"}}], 4, {"cpu": "1000m"}),  # requests first
        ([{"requests": {"cpu": "500m"}}, {"requests": {"cpu": "1"}}], 2, {"cpu": "3"}),  # mixed suffixes
        ([{"requests": {"memory": "1.5Gi"}}], 3, {"memory": "4.5Gi"}),
        ([{"requests": {"memory": "1e3"}}], 2, {"memory": "2000"}),
        ([{"requests": {"memory": "512Mi"}}, {"requests": {"memory": "1Gi"}}], 2, {"memory": "3221225472"}),
        ([{"requests": {"cpu": 2}}], 5, {"cpu": "10"}),
    ],
)
def test_min_resources_multiplies_what_one_pod_requests(
    containers: list[dict[str, Any]], count: int, expected: dict[str, str]
) -> None:
    pod = {"spec": {"containers": [{"resources": r} for r in containers]}}
    assert min_resources(pod, count) == expected


def test_a_pod_groups_drift_patches_only_the_fields_the_operator_sets() -> None:
    spec = job_spec(workers=3, **VOLCANO)
    want = desired.pod_group(spec, OWNER, desired.worker_pod(spec, OWNER, 0, 0))
    have = {**want, "spec": {**want["spec"], "minTaskMember": {"w": 1}}, "status": {"phase": "Inqueue"}}
    assert drift(want, have) is None
    smaller = {**want, "spec": {**want["spec"], "minMember": 2, "minResources": {"cpu": "1", "x/y": "1"}}}
    patch = drift(want, smaller)
    assert patch is not None and patch["spec"]["minMember"] == 3
    # A resource the operator no longer asks for is removed, not left behind by the merge patch.
    assert patch["spec"]["minResources"] == {"cpu": None, "x/y": None, "nvidia.com/gpu": "12"}


# --- GangScheduled and the timeout ------------------------------------------------------------------------


def worker(index: int, age_s: float, **kw: Any) -> PodState:
    fields: dict[str, Any] = {
        "name": f"rn50-worker-{index}", "role": "worker", "attempt": 0, "index": index, "phase": "Pending",
        "scheduled": False, "ready": False, "deleting": False, "created": NOW - timedelta(seconds=age_s),
    }  # fmt: skip
    fields.update(kw)
    return PodState(**fields)


UNSCHEDULABLE = "Unschedulable: 0/6 nodes are available: 4 Insufficient nvidia.com/gpu"
PENDING = JobStatus(phase="Pending", start_time=format_time(NOW - timedelta(minutes=1)))


def test_waiting_workers_say_so_and_wake_the_job_at_the_timeout() -> None:
    spec = job_spec(workers=4, **COSCHEDULING)
    pods = tuple(worker(i, age_s=10) for i in range(4))
    d = decide(spec, Observed(pods=pods), PENDING, NOW)
    cond = d.status.condition("GangScheduled")
    assert cond is not None and (cond.status, cond.reason) == ("False", "GangWaiting")
    assert "scheduler-plugins-scheduler to place all 4 workers together (0 placed)" in cond.message
    assert d.requeue_after == pytest.approx(20)
    assert not [e for e in d.events if e.reason == "GangScheduleTimeout"]


def test_a_gang_past_its_timeout_names_the_shortfall_once() -> None:
    spec = job_spec(workers=4, **COSCHEDULING)
    pods = tuple(worker(i, age_s=31, unschedulable=True, reason=UNSCHEDULABLE) for i in range(4))
    room = PoolRoom("kubernetes.azure.com/agentpool=gpu", (4, 4, 0, 0))
    d = decide(spec, Observed(pods=pods, pool_room=room), PENDING, NOW)
    cond = d.status.condition("GangScheduled")
    assert cond is not None and (cond.status, cond.reason) == ("False", "GangScheduleTimeout")
    assert cond.message.startswith(
        "gang of 4 workers needs 16 nvidia.com/gpu (4 per worker); 2 of 4 could be placed (8 nvidia.com/gpu "
        "free on the 4 nodes matching kubernetes.azure.com/agentpool=gpu); not placed together within "
        "runPolicy.scheduling.gang.scheduleTimeoutSeconds (30s), still waiting"
    )
    assert [(e.type, e.message) for e in d.events if e.reason == "GangScheduleTimeout"] == [
        ("Warning", cond.message)
    ]
    assert d.status.phase == "Pending" and d.status.message == cond.message
    # The next reconcile keeps the message without the pool (not read again) and without a second event.
    assert not wants_pool_room(spec, Observed(pods=pods), d.status, NOW)
    again = decide(spec, Observed(pods=pods), d.status, NOW + timedelta(seconds=5))
    again_cond = again.status.condition("GangScheduled")
    assert again_cond is not None and again_cond.message == cond.message
    assert not [e for e in again.events if e.reason == "GangScheduleTimeout"]
    # Placed at last: True, and an event that says so after the timeout.
    placed = tuple(worker(i, age_s=60, scheduled=True, phase="Running") for i in range(4))
    done = decide(spec, Observed(pods=placed), again.status, NOW + timedelta(seconds=30))
    done_cond = done.status.condition("GangScheduled")
    assert done_cond is not None and (done_cond.status, done_cond.reason) == ("True", "GangScheduled")
    assert [e.reason for e in done.events if e.reason == "GangScheduled"] == ["GangScheduled"]


def test_the_pool_is_read_only_for_a_gpu_gang_past_its_timeout() -> None:
    spec = job_spec(workers=2, **COSCHEDULING)
    late = Observed(pods=(worker(0, age_s=31), worker(1, age_s=31)))
    assert wants_pool_room(spec, late, PENDING, NOW)
    assert not wants_pool_room(spec, Observed(pods=(worker(0, age_s=5), worker(1, age_s=29))), PENDING, NOW)
    assert not wants_pool_room(job_spec(workers=2), late, PENDING, NOW)
    placed = Observed(pods=(worker(0, age_s=31, scheduled=True), worker(1, age_s=31, scheduled=True)))
    assert not wants_pool_room(spec, placed, PENDING, NOW)


def test_when_the_gpus_are_there_the_pods_verdict_or_the_silence_is_named() -> None:
    spec = job_spec(workers=2, **COSCHEDULING)
    room = PoolRoom("pool=gpu", (4, 4))
    silent = (worker(0, age_s=40), worker(1, age_s=40))
    assert shortfall(spec, 2, silent, room, "scheduler-plugins-scheduler").endswith(
        "no verdict from scheduler-plugins-scheduler on any worker: is it running?"
    )
    refused = (worker(0, age_s=40, unschedulable=True, reason="Unschedulable: 1 Insufficient cpu"), silent[1])
    assert shortfall(spec, 2, refused, room, "s").endswith("rn50-worker-0: Unschedulable: 1 Insufficient cpu")
    # Without the pool (a namespace-scoped install), the placed count.
    assert "; 0 of 2 placed;" in shortfall(spec, 2, refused, None, "s")


def test_pool_room_subtracts_what_running_pods_hold_but_not_the_jobs_own() -> None:
    nodes = [
        {"metadata": {"name": "a"}, "status": {"allocatable": {"nvidia.com/gpu": "4"}}},
        {"metadata": {"name": "b"}, "status": {"allocatable": {"nvidia.com/gpu": "4"}}},
        {"metadata": {"name": "c"}, "spec": {"unschedulable": True},
         "status": {"allocatable": {"nvidia.com/gpu": "4"}}},
    ]  # fmt: skip

    def gpu_pod(n: int, job: str = "other", phase: str = "Running") -> dict[str, Any]:
        return {
            "metadata": {"labels": {"dtjob.io/job-name": job}},
            "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": str(n)}}}]},
            "status": {"phase": phase},
        }

    by_node = {"a": [gpu_pod(3), gpu_pod(4, phase="Succeeded")], "b": [gpu_pod(4, job="rn50")]}
    room = pool_room("pool=gpu", nodes, by_node, "nvidia.com/gpu",
                     lambda p: p["metadata"]["labels"]["dtjob.io/job-name"] == "rn50")  # fmt: skip
    assert room == PoolRoom("pool=gpu", (1, 4))  # cordoned c takes no new pods


def test_the_pool_rooms_pods_are_kept_as_what_it_reads_of_them() -> None:
    """The pods on a pool's nodes are every tenant's, their labels, annotations and statuses as large as
    1.5 MiB allows: the LIST keeps of each what pool_room reads, and the room is the same."""
    view = pod_view("nvidia.com/gpu", "dtjob.io/job-name")
    big = {
        "metadata": {"name": "p", "namespace": "other", "annotations": {"pad": "x" * 500_000},
                     "labels": {"dtjob.io/job-name": "rn50", **{f"l{i}": "v" for i in range(5_000)}}},
        "spec": {"containers": [{"name": f"c{i}", "image": "i" * 300, "env": [{"name": "A"}],
                                 "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "2"}}}
                                for i in range(3)],
                 "initContainers": [{"name": "init", "resources": {"requests": {"nvidia.com/gpu": "4"}}}]},
        "status": {"phase": "Running", "containerStatuses": [{"message": "m" * 100_000}]},
    }  # fmt: skip
    kept = view(big)
    assert len(json.dumps(kept)) < 600, kept
    assert kept["metadata"] == {"namespace": "other", "labels": {"dtjob.io/job-name": "rn50"}}
    nodes = [{"metadata": {"name": "a"}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}]
    for skip in (lambda p: False, lambda p: p["metadata"]["labels"].get("dtjob.io/job-name") == "rn50"):
        assert pool_room("", nodes, {"a": [kept]}, "nvidia.com/gpu", skip) == pool_room(
            "", nodes, {"a": [big]}, "nvidia.com/gpu", skip
        )
    assert pool_room("", nodes, {"a": [kept]}, "nvidia.com/gpu", lambda p: False).free == (4,)


def test_the_pod_group_goes_when_the_job_ends_or_is_suspended() -> None:
    spec = job_spec(workers=1, **COSCHEDULING)
    running = JobStatus(phase="Running", start_time=format_time(NOW), launcher_pod="rn50-launcher-x")
    past = decide(
        job_spec(workers=1, runPolicy={"activeDeadlineSeconds": 1, **COSCHEDULING["runPolicy"]}),
        Observed(), JobStatus(phase="Running", start_time=format_time(NOW - timedelta(hours=1))), NOW,
    )  # fmt: skip
    assert past.status.phase == "Failed" and DeletePodGroup() in past.actions
    suspended = job_spec(workers=1, runPolicy={"suspend": True, **COSCHEDULING["runPolicy"]})
    assert DeletePodGroup() in decide(suspended, Observed(), running, NOW).actions
    assert DeletePodGroup() not in decide(suspended, Observed(), JobStatus(phase="Suspended"), NOW).actions
    # A new world ensures it (EnsureWorld creates it first).
    assert EnsureWorld() in decide(spec, Observed(), JobStatus(), NOW).actions


# --- one reconcile's calls ----------------------------------------------------------------------------------


def test_the_pod_group_is_created_before_anything_else_of_the_world() -> None:
    kube = RecordingKube()
    new_job(kube, **COSCHEDULING)
    reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW)
    assert [w for w in kube.writes() if w[0] == "create"][:2] == [
        ("create", "PodGroup", "rn50"), ("create", "Secret", "rn50-ssh")
    ]  # fmt: skip
    group = kube.objects[("PodGroup", "ml", "rn50")]
    assert group["spec"]["minMember"] == 2


def test_a_cluster_without_the_pod_group_api_gets_nothing_and_a_condition_naming_it() -> None:
    kube = RecordingKube(not_served={"scheduling.volcano.sh/v1beta1"})
    new_job(kube, **VOLCANO)
    requeue = reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW)
    assert [w for w in kube.writes() if w[0] == "create"] == [("create", "PodGroup", "rn50")]
    status = kube.objects[(JOB_KIND, "ml", "rn50")]["status"]
    created = next(c for c in status["conditions"] if c["type"] == "Created")
    assert (created["status"], created["reason"]) == ("False", "GangSchedulerMissing")
    assert created["message"].startswith(
        "spec.runPolicy.scheduling.gang.scheduler volcano: the cluster does not serve PodGroup "
        "(scheduling.volcano.sh/v1beta1); install Volcano"
    )
    assert status["phase"] == "Pending" and requeue == 30
    assert ("Warning", "GangSchedulerMissing") in kube.events


def test_the_next_world_brings_a_kept_pod_group_back_in_line() -> None:
    # The PodGroup outlives a world restart; the next world, after spec.workers changed, resizes it.
    kube = RecordingKube()
    new_job(kube, workers=3, **COSCHEDULING)
    kube.put({"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
              "metadata": {"name": "rn50", "namespace": "ml", "ownerReferences": [OWNER]},
              "spec": {"minMember": 2, "scheduleTimeoutSeconds": 30}})  # fmt: skip
    reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW)
    assert ("patch", "PodGroup", "rn50") in kube.writes()
    assert kube.objects[("PodGroup", "ml", "rn50")]["spec"]["minMember"] == 3


def test_the_pool_room_counts_only_nodes_the_workers_may_use() -> None:
    """A job that names another team's pool, whose taint it does not tolerate, learns nothing of that pool's
    size or free GPUs from its gang's message (preflight passed it by: the pool it may use is empty); the
    nodes its affinity leaves out are not counted either."""
    kube = RecordingKube()
    pool = "kubernetes.azure.com/agentpool"
    for name, zone in (("b-0", "1"), ("b-1", "2")):
        kube.nodes.append({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {pool: "teamb", "zone": zone}},
            "spec": {"taints": [{"key": "team", "value": "b", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}},
        })  # fmt: skip
    gang = {"runPolicy": {"scheduling": {"gang": COSCHEDULING_GANG}}}
    assert _pool_room(kube, job_spec(placement={"nodePool": "teamb"}, **gang)) is None
    toleration = {"key": "team", "operator": "Equal", "value": "b", "effect": "NoSchedule"}
    tolerated = job_spec(placement={"nodePool": "teamb", "tolerations": [toleration]}, **gang)
    assert _pool_room(kube, tolerated) == PoolRoom(f"{pool}=teamb", (8, 8))
    by_template = {"template": {"spec": {"tolerations": [toleration]}}}
    by_template_spec = job_spec(placement={"nodePool": "teamb"}, worker=by_template, **gang)
    assert _pool_room(kube, by_template_spec) == PoolRoom(f"{pool}=teamb", (8, 8)), "as the pods count it"
    zone_1 = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["1"]}]}]}}}  # fmt: skip
    narrowed = job_spec(
        placement={"nodePool": "teamb", "tolerations": [toleration], "affinity": zone_1}, **gang
    )
    assert _pool_room(kube, narrowed) == PoolRoom(f"{pool}=teamb and spec.placement.affinity", (8,))
