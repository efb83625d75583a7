"""What Kueue's copy of a dispatched job trusts in its kueue.x-k8s.io/prebuilt-workload-name label: a job may
name only its own Workload; its world (which joins no pod group of Kueue's) exists only while that Workload,
as read, is MultiKueue's, controlled by no other object and admitted; and only such a Workload is ever marked
Finished; and the world it creates is the one that Workload admitted. tests/security/test_kueue_labels.py
runs the attacks against a real Kueue."""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from dtjob.desired.common import owner_reference
from dtjob.desired.workload import world_pod_sets
from dtjob.machine import decide
from dtjob.machine.prebuilt import PREBUILT_NOT_ADMITTED, admitted_world, prebuilt_problem, world_problem
from dtjob.reconcile.dispatch import finish_prebuilt
from dtjob.reconcile.job import reconcile
from dtjob.spec.managed_by import (
    MULTIKUEUE_ORIGIN_LABEL,
    PREBUILT_WORKLOAD_ANNOTATION,
    PREBUILT_WORKLOAD_ANNOTATION_FIELD,
    PREBUILT_WORKLOAD_FIELD,
    PREBUILT_WORKLOAD_LABEL,
    prebuilt_workload,
)
from dtjob.spec.parse import SpecError, parse_spec
from dtjob.state.decision import CreateWorker, DeletePod
from dtjob.state.observed import Children, Observed, PodState, launcher_state
from dtjob.state.prebuilt import PrebuiltWorkload, prebuilt_state
from dtjob.state.status import JobStatus

from tests.unit.operator_fixtures import CONFIG, job_body
from tests.unit.recording_kube import JOB_KIND, RecordingKube

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
QUEUED: dict[str, Any] = {"runPolicy": {"scheduling": {"queueName": "team"}}}
WORKLOAD = "Workload"
WORLD = world_pod_sets(parse_spec(job_body(**QUEUED), CONFIG), owner_reference("rn50", "uid-1"))
# MultiKueue's copy of the manager's Workload on a worker (labels and spec, no ownerReferences), admitted.
OURS: dict[str, Any] = {
    "apiVersion": "kueue.x-k8s.io/v1beta1",
    "kind": WORKLOAD,
    "metadata": {"name": "dtjob-rn50", "namespace": "ml", "resourceVersion": "7",
                 "labels": {MULTIKUEUE_ORIGIN_LABEL: "multikueue"}},
    "spec": {"queueName": "team", "podSets": WORLD},
    "status": {
        "admission": {"clusterQueue": "cq", "podSetAssignments": []},
        "conditions": [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}],
    },
}  # fmt: skip


def labelled(value: str, name: str = "rn50", **spec: Any) -> dict[str, Any]:
    body = job_body(name, **QUEUED, **spec)
    body["metadata"]["labels"] = {PREBUILT_WORKLOAD_LABEL: value}
    return body


@pytest.mark.parametrize(
    ("label", "annotation", "field"),
    [
        ("dtjob-victim", "dtjob-rn50", PREBUILT_WORKLOAD_FIELD),
        ("dtjob-rn50", "dtjob-victim", PREBUILT_WORKLOAD_ANNOTATION_FIELD),
        (None, "dtjob-victim", PREBUILT_WORKLOAD_ANNOTATION_FIELD),
    ],
)
def test_a_label_and_an_annotation_must_both_name_the_jobs_own_workload(
    label: str | None, annotation: str, field: str
) -> None:
    """Kueue v0.18+ names the copy's Workload in an annotation (and reads it first), older Kueue in a label:
    a job that sets both cannot have one of them name another job's Workload."""
    body = job_body("rn50", **QUEUED)
    body["metadata"]["labels"] = {PREBUILT_WORKLOAD_LABEL: label} if label else {}
    body["metadata"]["annotations"] = {PREBUILT_WORKLOAD_ANNOTATION: annotation}
    with pytest.raises(SpecError) as err:
        parse_spec(body, CONFIG)
    assert err.value.path == field and "'dtjob-victim'" in err.value.message
    assert prebuilt_workload(body) is None
    body["metadata"]["annotations"] = {PREBUILT_WORKLOAD_ANNOTATION: "dtjob-rn50"}
    if label == "dtjob-victim":
        body["metadata"]["labels"] = {}
    spec = parse_spec(body, CONFIG)
    assert (spec.prebuilt_workload, spec.prebuilt_field) == ("dtjob-rn50", PREBUILT_WORKLOAD_ANNOTATION_FIELD)


def workload(*edits: tuple[str, Any]) -> dict[str, Any]:
    """OURS with `edits`: (dotted path, value); a value of None removes the key."""
    found = copy.deepcopy(OURS)
    for path, value in edits:
        *parents, key = path.split(".")
        node = found
        for part in parents:
            node = node[part]
        if value is None:
            node.pop(key, None)
        else:
            node[key] = value
    return found


def test_a_job_may_name_only_its_own_workload() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(labelled("dtjob-victim"), CONFIG)
    assert err.value.path == PREBUILT_WORKLOAD_FIELD
    assert "'dtjob-victim', not this job's own 'dtjob-rn50'" in err.value.message
    assert prebuilt_workload(labelled("dtjob-victim")) is None
    spec = parse_spec(labelled("dtjob-rn50"), CONFIG)
    assert spec.prebuilt_workload == "dtjob-rn50" and spec.run_policy.scheduling.queue_name is None
    spec = parse_spec(job_body(**QUEUED), CONFIG)
    assert spec.prebuilt_workload is None and spec.run_policy.scheduling.queue_name == "team"


CONTROLLER = {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "uid-other", "controller": True}
ADOPTED = {**CONTROLLER, "kind": "DistributedTrainingJob", "uid": "uid-1"}
NOT_MULTIKUEUES = f"was not made by MultiKueue (it has no {MULTIKUEUE_ORIGIN_LABEL} label)"


@pytest.mark.parametrize(
    ("edits", "problem"),
    [
        ((), None),
        # Kueue's own adoption of a prebuilt Workload makes the job its controller: still this job's.
        ((("metadata.ownerReferences", [ADOPTED]),), None),
        ((("metadata.ownerReferences", [{**CONTROLLER, "controller": False}]),), None),
        ((("metadata.ownerReferences", [CONTROLLER]),), "is controlled by Pod p, not by this job"),
        ((("metadata.labels", {}),), NOT_MULTIKUEUES),
        ((("status.admission", None),), "Workload dtjob-rn50 is not admitted"),
        ((("status.conditions", [{"type": "QuotaReserved", "status": "True"}]),), "is not admitted"),
        ((("status.conditions", [*OURS["status"]["conditions"], {"type": "Evicted", "status": "True"}]),),
         "is not admitted"),
        ((("status.conditions", [*OURS["status"]["conditions"], {"type": "Finished", "status": "True"}]),),
         "Workload dtjob-rn50 has finished"),
        ((("status", None),), "is not admitted"),
    ],
)  # fmt: skip
def test_only_multikueues_admitted_workload_uncontrolled_by_another_object_holds_a_copys_quota(
    edits: tuple[tuple[str, Any], ...], problem: str | None
) -> None:
    found = prebuilt_problem(prebuilt_state("dtjob-rn50", workload(*edits), "uid-1"))
    assert found == problem if problem is None else problem in str(found), found
    absent = prebuilt_problem(prebuilt_state("dtjob-rn50", None, "uid-1"))
    assert absent == "Workload dtjob-rn50 does not exist in the job's namespace"


def worker(i: int) -> PodState:
    return PodState(f"rn50-worker-{i}", "worker", 0, i, "Running", True, True, False, uid=f"uid-w{i}")


def test_a_copy_waits_with_no_world_until_its_workload_is_admitted_then_creates_it_outside_kueue() -> None:
    spec = parse_spec(labelled("dtjob-rn50"), CONFIG)
    unadmitted = PrebuiltWorkload("dtjob-rn50", found=True, from_multikueue=True)
    waiting = decide(spec, Observed(prebuilt=unadmitted), JobStatus(), NOW)
    assert waiting.actions == [] and waiting.status.phase == "Pending"
    created = waiting.status.condition("Created")
    assert created is not None and created.reason == PREBUILT_NOT_ADMITTED
    assert waiting.status.message.startswith(
        f"{PREBUILT_WORKLOAD_FIELD}: Workload dtjob-rn50 is not admitted"
    )
    assert waiting.requeue_after == 15.0 and [e.reason for e in waiting.events] == [PREBUILT_NOT_ADMITTED]

    ours = prebuilt_state("dtjob-rn50", OURS, "uid-1")
    started = decide(spec, Observed(prebuilt=ours), JobStatus(), NOW)
    assert [a for a in started.actions if isinstance(a, CreateWorker)] == [
        CreateWorker(0, 0),
        CreateWorker(1, 0),
    ]


def test_a_copy_whose_pods_the_workers_kueue_gates_says_why_and_what_to_change() -> None:
    """A copy's pods name no queue: a LocalQueue named default in the namespace (Kueue's LocalQueue
    defaulting), or manageJobsWithoutQueueName, makes Kueue gate them and ask their quota again, though the
    copied Workload holds it. The copy says so (its status reaches the manager's job)."""
    spec = parse_spec(labelled("dtjob-rn50"), CONFIG)
    gated = [replace(worker(i), phase="Pending", scheduled=False, ready=False, gated=True) for i in (0, 1)]
    observed = Observed(pods=tuple(gated), prebuilt=prebuilt_state("dtjob-rn50", OURS, "uid-1"))
    said = decide(spec, observed, JobStatus(phase="Pending"), NOW).status.message
    assert "2 worker pod(s) wait for admission by Kueue" in said, said
    assert "LocalQueue named default" in said and "manageJobsWithoutQueueName" in said, said
    # A job queued on its own cluster waits for its own admission: no word of MultiKueue.
    queued = parse_spec(job_body(**QUEUED), CONFIG)
    said = decide(queued, Observed(pods=tuple(gated)), JobStatus(phase="Pending"), NOW).status.message
    assert said.endswith("2 worker pod(s) wait for admission by Kueue"), said


def test_a_running_copy_whose_pods_the_workers_kueue_also_admitted_says_their_quota_counts_twice() -> None:
    """With quota for both, Kueue admits a copy's pods taken by a LocalQueue named default (its finalizer on
    them) and the job runs, holding the quota twice. The copy says so as it runs; nothing else changes, so a
    namespace admin who puts Kueue's finalizer on a copy's pod only makes their own job say this."""
    spec = parse_spec(labelled("dtjob-rn50"), CONFIG)
    pod = PodState("rn50-launcher", "launcher", 0, None, "Running", True, True, False, uid="uid-l")
    ours = prebuilt_state("dtjob-rn50", OURS, "uid-1")
    running = JobStatus(phase="Running", start_time="2026-05-01T11:00:00Z")

    def run(pods: list[PodState], prebuilt: PrebuiltWorkload | None = ours, job: Any = spec) -> Any:
        observed = Observed(pods=tuple(pods), launcher=launcher_state(pods[-1]), prebuilt=prebuilt)
        return decide(job, observed, running, NOW)

    plain = run([worker(0), worker(1), pod])
    taken = run([replace(p, kueue_finalizer=True) for p in (worker(0), worker(1), pod)])
    assert plain.status.phase == taken.status.phase == "Running"
    assert "Kueue" not in plain.status.message, plain.status.message
    said = taken.status.message
    assert said.startswith(plain.status.message), said
    assert "counts 3 of its pods' quota a second time" in said and "LocalQueue named default" in said, said
    assert taken.actions == plain.actions and taken.events == plain.events
    # A job queued on its own cluster is admitted by its own Kueue: no word of MultiKueue.
    queued = parse_spec(job_body(**QUEUED), CONFIG)
    own = run([replace(p, kueue_finalizer=True) for p in (worker(0), worker(1), pod)], None, queued)
    assert "second time" not in own.status.message, own.status.message


def test_a_world_whose_workload_no_longer_holds_its_quota_is_deleted() -> None:
    spec = parse_spec(labelled("dtjob-rn50"), CONFIG)
    pod = PodState("rn50-launcher", "launcher", 0, None, "Running", True, True, False, uid="uid-l")
    evicted = prebuilt_state("dtjob-rn50", workload(("status.conditions", [])), "uid-1")
    observed = Observed(pods=(worker(0), worker(1), pod), launcher=launcher_state(pod), prebuilt=evicted)
    running = JobStatus(phase="Running", start_time="2026-05-01T11:00:00Z")
    stopped = decide(spec, observed, running, NOW)
    assert stopped.actions == [
        DeletePod("rn50-worker-0", "uid-w0"),
        DeletePod("rn50-worker-1", "uid-w1"),
        DeletePod("rn50-launcher", "uid-l"),
    ]
    assert stopped.status.phase == "Pending" and stopped.status.condition("Created") is not None


def _kube(*workloads: dict[str, Any]) -> RecordingKube:
    kube = RecordingKube()
    for found in workloads:
        kube.put(found)
    return kube


@pytest.mark.parametrize(
    "victim",
    [
        workload(("metadata.labels", {})),  # a Workload of Kueue's pod groups, or anyone's
        workload(("metadata.ownerReferences", [CONTROLLER])),
        workload(("status", {"conditions": [{"type": "QuotaReserved", "status": "False"}]})),
    ],
)
def test_only_the_jobs_own_admitted_multikueue_workload_is_marked_finished(victim: dict[str, Any]) -> None:
    kube = _kube(victim)
    finish_prebuilt(kube, labelled("dtjob-rn50"), JobStatus(phase="Failed", message="x"), NOW)
    assert kube.writes() == []
    kube = _kube(OURS)
    finish_prebuilt(kube, labelled("dtjob-rn50"), JobStatus(phase="Failed", message="x"), NOW)
    assert kube.writes() == [("patch-status", WORKLOAD, "dtjob-rn50")]


def test_a_job_naming_another_jobs_workload_fails_at_once_and_never_touches_it() -> None:
    """The finding: a job labelled with a victim's Workload and a spec the operator rejects ended at once and
    marked the victim's Workload Finished (Kueue then freed its quota while its pods ran)."""
    kube = _kube(workload(("metadata.name", "dtjob-victim")))
    env = [{"name": "OMPI_MCA_plm_rsh_no_tree_spawn", "value": "false"}]  # a spec only the operator rejects
    kube.put({**labelled("dtjob-victim", launcher={"template": {"spec": {"containers": [
        {"name": "launcher", "env": env}]}}}), "kind": JOB_KIND})  # fmt: skip
    reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW)
    assert [w for w in kube.writes() if w[1] != JOB_KIND] == []
    assert kube.objects[(JOB_KIND, "ml", "rn50")]["status"]["phase"] == "Failed"


def test_a_copy_edited_on_the_worker_runs_no_more_than_its_workload_admitted() -> None:
    ours = prebuilt_state("dtjob-rn50", OURS, "uid-1")
    more = decide(
        parse_spec(labelled("dtjob-rn50", workers=8), CONFIG), Observed(prebuilt=ours), JobStatus(), NOW
    )
    assert more.actions == [] and more.status.phase == "Pending"
    assert (
        "admitted 2 worker and 1 launcher pods, not the 8 worker and 1 launcher pods" in more.status.message
    )
    bigger = parse_spec(labelled("dtjob-rn50", gpusPerWorker=8), CONFIG)
    assert "with other resource requests than the spec's" in str(world_problem(ours, bigger, "uid-1"))
    # Kueue's conversion webhook writes quantities back in canonical form: the same requests.
    canonical = copy.deepcopy(WORLD)
    container = canonical[0]["template"]["spec"]["containers"][0]
    container["resources"]["limits"]["nvidia.com/gpu"] = "4000m"
    rewritten = prebuilt_state("dtjob-rn50", workload(("spec.podSets", canonical)), "uid-1")
    assert world_problem(rewritten, parse_spec(labelled("dtjob-rn50"), CONFIG), "uid-1") is None


ELASTIC: dict[str, Any] = {"workers": 4, "elastic": {"minWorkers": 2, "maxWorkers": 4}}


def _admitted(spec_fields: dict[str, Any], counts: list[dict[str, Any]]) -> dict[str, Any]:
    """OURS for the world of `spec_fields`, its status.admission naming `counts` (podSetAssignments)."""
    spec = parse_spec(labelled("dtjob-rn50", **spec_fields), CONFIG)
    pod_sets = world_pod_sets(spec, owner_reference("rn50", "manager-uid"))
    admission = {"clusterQueue": "cq", "podSetAssignments": counts}
    return workload(("spec.podSets", pod_sets), ("status.admission", admission))


def test_an_elastic_workload_lets_kueue_admit_down_to_min_workers() -> None:
    spec = parse_spec(labelled("dtjob-rn50", **ELASTIC), CONFIG)
    worker, launcher = world_pod_sets(spec, owner_reference("rn50", "uid-1"))
    assert (worker["count"], worker["minCount"]) == (4, 2) and "minCount" not in launcher
    fixed = parse_spec(labelled("dtjob-rn50", workers=4), CONFIG)
    assert "minCount" not in world_pod_sets(fixed, owner_reference("rn50", "uid-1"))[0]


def test_an_elastic_copy_admitted_in_part_runs_the_workers_kueue_admitted() -> None:
    """Kueue's partial admission: 2 of the 4 workers (the pod set's minCount is spec.elastic.minWorkers). The
    copy's world aims for 2, and is no more than the Workload admitted."""
    found = _admitted(ELASTIC, [{"name": "worker", "count": 2}, {"name": "launcher", "count": 1}])
    ours = prebuilt_state("dtjob-rn50", found, "uid-1")
    assert ours.admitted_counts == {"worker": 2}
    spec = admitted_world(parse_spec(labelled("dtjob-rn50", **ELASTIC), CONFIG), ours)
    assert (spec.workers, spec.workload_workers) == (2, 4)
    assert world_problem(ours, spec, "uid-1") is None
    started = decide(spec, Observed(prebuilt=ours), JobStatus(), NOW)
    assert [a for a in started.actions if isinstance(a, CreateWorker)] == [
        CreateWorker(0, 0),
        CreateWorker(1, 0),
    ]
    # Admitted whole (counts as asked, or none written): the spec's own world.
    whole = prebuilt_state("dtjob-rn50", _admitted(ELASTIC, [{"name": "worker", "count": 4}]), "uid-1")
    assert whole.admitted_counts == {} and admitted_world(spec, whole) is spec


@pytest.mark.parametrize(
    ("spec_fields", "count"),
    [({"workers": 4}, 2), (ELASTIC, 1)],  # a fixed world; an elastic one below its minWorkers
)
def test_a_world_kueue_admitted_fewer_workers_than_it_runs_waits(
    spec_fields: dict[str, Any], count: int
) -> None:
    found = _admitted(spec_fields, [{"name": "worker", "count": count}])
    ours = prebuilt_state("dtjob-rn50", found, "uid-1")
    spec = admitted_world(parse_spec(labelled("dtjob-rn50", **spec_fields), CONFIG), ours)
    assert spec.workers == 4
    waiting = decide(spec, Observed(prebuilt=ours), JobStatus(), NOW)
    assert waiting.actions == [] and waiting.status.phase == "Pending"
    assert f"Workload dtjob-rn50 admitted only {count} of the 4 workers" in waiting.status.message
