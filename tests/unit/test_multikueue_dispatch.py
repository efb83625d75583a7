"""MultiKueue's two ends, against the in-memory recording Kube: on the manager a dispatched job
(spec.managedBy kueue.x-k8s.io/multikueue) gets its Workload and nothing else; on a worker Kueue's copy runs
outside Kueue's pod groups and its prebuilt Workload (its own, MultiKueue's, admitted) is marked Finished
when it ends; tests/unit/test_prebuilt_workload.py holds what a copy trusts in that Workload.
tests/integration/test_multikueue.py runs both ends against real API servers and real Kueue."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from dtjob import names
from dtjob.desired.common import owner_reference
from dtjob.desired.workload import (
    KUEUE_APIS,
    PRIORITY_CLASS_KIND,
    dispatch_queue,
    dispatch_workload,
    finished_conditions,
)
from dtjob.gang import registry
from dtjob.gang.kueue import PRIORITY_CLASS_LABEL
from dtjob.machine import wound_down
from dtjob.reconcile.dispatch import (
    INVALID_SPEC,
    NO_PRIORITY_CLASS,
    NO_QUEUE,
    PRIORITY_RETRY_S,
    WORKLOAD_CREATED,
    finish_prebuilt,
)
from dtjob.reconcile.job import reconcile
from dtjob.spec.managed_by import (
    MULTIKUEUE,
    PREBUILT_WORKLOAD_LABEL,
    THIS_OPERATOR,
    dispatched,
    handled_here,
    prebuilt_workload,
    workload_name,
)
from dtjob.spec.parse import parse_spec
from dtjob.state.observed import Children
from dtjob.state.status import JobStatus

from tests.unit.operator_fixtures import CONFIG, job_body, job_spec
from tests.unit.recording_kube import JOB_KIND, RecordingKube

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
QUEUED: dict[str, Any] = {"runPolicy": {"scheduling": {"queueName": "team"}}}
WORKLOAD = "Workload"


def dispatched_job(kube: RecordingKube, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    body = job_body(managedBy=MULTIKUEUE, **spec)
    body["metadata"]["labels"] = dict(labels or {})
    return kube.put({**body, "kind": JOB_KIND})


@pytest.mark.parametrize(
    ("controller", "is_dispatched", "handled"),
    [(THIS_OPERATOR, False, True), (MULTIKUEUE, True, True), ("example.com/other", False, False)],
)
def test_the_operator_handles_its_own_jobs_and_multikueues(
    controller: str, is_dispatched: bool, handled: bool
) -> None:
    job = {"spec": {"managedBy": controller}}
    assert dispatched(job) == is_dispatched and handled_here(job) == handled


def test_the_queue_is_the_specs_else_kueues_label() -> None:
    assert dispatch_queue(job_body(**QUEUED)) == "team"
    labelled = job_body()
    labelled["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "other"}
    assert dispatch_queue(labelled) == "other"
    assert dispatch_queue({**labelled, "spec": {**labelled["spec"], **QUEUED}}) == "team"
    assert dispatch_queue(job_body()) is None


@pytest.mark.parametrize("api", KUEUE_APIS)
def test_the_workload_asks_for_the_workers_and_the_launcher_owned_by_the_job(api: str) -> None:
    spec = job_spec(workers=3, gpusPerWorker=2, **QUEUED)
    owner = owner_reference("rn50", "uid-1")
    workload = dispatch_workload(spec, owner, "team", api)
    assert workload["apiVersion"] == api and workload["kind"] == WORKLOAD
    assert not {"priority", "priorityClassRef", "priorityClassName"} & set(workload["spec"])
    assert workload["metadata"]["name"] == workload_name("rn50") == "dtjob-rn50"
    assert workload["metadata"]["ownerReferences"] == [owner] and owner["controller"] is True
    assert workload["spec"]["queueName"] == "team"
    worker, launcher = workload["spec"]["podSets"]
    assert (worker["name"], worker["count"], launcher["name"], launcher["count"]) == (
        names.ROLE_WORKER, 3, names.ROLE_LAUNCHER, 1
    )  # fmt: skip
    resources = worker["template"]["spec"]["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == "2", resources
    assert "nvidia.com/gpu" not in launcher["template"]["spec"]["containers"][0].get("resources", {}).get(
        "limits", {}
    )
    # The pods' pod-group labels belong to Kueue's pod integration, which this Workload replaces.
    labels = worker["template"]["metadata"]["labels"]
    assert not any(k.startswith("kueue.x-k8s.io/") for k in labels), labels
    assert set(worker["template"]) == {"metadata", "spec"} and "name" not in worker["template"]["metadata"]


@pytest.mark.parametrize(
    ("not_served", "api"),
    [
        (set(), "kueue.x-k8s.io/v1beta2"),  # Kueue v0.15 to v0.19: both, v1beta2 the newer
        ({"kueue.x-k8s.io/v1beta1"}, "kueue.x-k8s.io/v1beta2"),  # v0.20 on
        ({"kueue.x-k8s.io/v1beta2"}, "kueue.x-k8s.io/v1beta1"),  # before v0.15
    ],
)
def test_the_workload_is_made_in_the_newest_version_the_cluster_serves(
    not_served: set[str], api: str
) -> None:
    kube = RecordingKube(not_served=not_served)
    dispatched_job(kube, **QUEUED)
    reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW)
    assert kube.objects[(WORKLOAD, "ml", "dtjob-rn50")]["apiVersion"] == api


def _priority_class(kube: RecordingKube, name: str, value: Any) -> None:
    kube.put({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": PRIORITY_CLASS_KIND, "metadata": {"name": name},
              "value": value})  # fmt: skip


@pytest.mark.parametrize(
    ("not_served", "fields"),
    [
        (
            set(),
            {"priorityClassRef": {"group": "kueue.x-k8s.io", "kind": PRIORITY_CLASS_KIND, "name": "high"}},
        ),
        (
            {"kueue.x-k8s.io/v1beta2"},
            {"priorityClassName": "high", "priorityClassSource": "kueue.x-k8s.io/workloadpriorityclass"},
        ),
    ],
)
def test_the_priority_class_label_gives_the_workload_that_class_and_its_value(
    not_served: set[str], fields: dict[str, Any]
) -> None:
    kube = RecordingKube(not_served=not_served)
    _priority_class(kube, "high", 10_000)
    dispatched_job(kube, {PRIORITY_CLASS_LABEL: "high"}, **QUEUED)
    assert reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW) is None
    spec = kube.objects[(WORKLOAD, "ml", "dtjob-rn50")]["spec"]
    assert spec["priority"] == 10_000
    assert {k: spec[k] for k in fields} == fields


@pytest.mark.parametrize("value", [None, "10000", True])
def test_a_priority_class_that_cannot_be_read_holds_the_workload_back_and_says_so(value: Any) -> None:
    kube = RecordingKube()
    if value is not None:
        _priority_class(kube, "high", value)
    job = dispatched_job(kube, {PRIORITY_CLASS_LABEL: "high"}, **QUEUED)
    assert reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW) == PRIORITY_RETRY_S
    assert kube.writes() == [] and kube.events == [("Warning", NO_PRIORITY_CLASS)]
    # Once the class is there (a value Kueue's CRD accepts), the next look creates the Workload at it.
    kube.put({"kind": "Event", "metadata": {"name": "rn50.1", "namespace": "ml"}, "reason": NO_PRIORITY_CLASS,
              "involvedObject": {"uid": job["metadata"]["uid"]}})  # fmt: skip
    _priority_class(kube, "high", 5)
    assert reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW) is None
    assert kube.objects[(WORKLOAD, "ml", "dtjob-rn50")]["spec"]["priority"] == 5
    assert kube.events == [("Warning", NO_PRIORITY_CLASS), ("Normal", WORKLOAD_CREATED)]


def test_a_class_gone_after_the_workload_was_made_changes_nothing() -> None:
    """The class is read when the Workload is made; its deletion later neither warns nor polls."""
    kube = RecordingKube()
    _priority_class(kube, "high", 10_000)
    dispatched_job(kube, {PRIORITY_CLASS_LABEL: "high"}, **QUEUED)
    reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW)
    del kube.objects[(PRIORITY_CLASS_KIND, "", "high")]
    assert reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW) is None
    assert kube.events == [("Normal", WORKLOAD_CREATED)]
    assert kube.objects[(WORKLOAD, "ml", "dtjob-rn50")]["spec"]["priority"] == 10_000


def test_the_manager_creates_only_the_workload_once_and_writes_no_status() -> None:
    kube = RecordingKube()
    dispatched_job(kube, **QUEUED)
    assert reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW) is None
    assert kube.writes() == [("create", WORKLOAD, "dtjob-rn50")]
    assert kube.events == [("Normal", WORKLOAD_CREATED)]
    reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW)
    assert kube.writes() == [("create", WORKLOAD, "dtjob-rn50")] * 2  # the second answered 409
    assert kube.events == [("Normal", WORKLOAD_CREATED)]
    assert "status" not in kube.objects[(JOB_KIND, "ml", "rn50")]


def test_a_dispatched_job_without_a_queue_is_warned_about_once_and_gets_nothing() -> None:
    kube = RecordingKube()
    job = dispatched_job(kube)
    reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW)
    assert kube.writes() == [] and kube.events == [("Warning", NO_QUEUE)]
    # Its Event is there: the next resync posts none.
    kube.put({"kind": "Event", "metadata": {"name": "rn50.1", "namespace": "ml"}, "reason": NO_QUEUE,
              "involvedObject": {"uid": job["metadata"]["uid"]}})  # fmt: skip
    reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW)
    assert kube.events == [("Warning", NO_QUEUE)] and kube.writes() == []
    assert "status" not in kube.objects[(JOB_KIND, "ml", "rn50")]


def test_a_dispatched_job_with_an_invalid_spec_is_warned_about_and_not_dispatched() -> None:
    kube = RecordingKube()
    dispatched_job(kube, workers=0, **QUEUED)
    reconcile(kube, CONFIG, "ml", "rn50", Children(), NOW)
    assert kube.writes() == [] and kube.events == [("Warning", INVALID_SPEC)]


@pytest.mark.parametrize("where", ["labels", "annotations"])  # Kueue before v0.18, and from it on
def test_the_copy_on_a_worker_joins_no_pod_group_of_kueue(where: str) -> None:
    body = job_body(**QUEUED)
    assert registry.schedulers(parse_spec(body, CONFIG))  # on its own cluster, Kueue admits its world
    body["metadata"][where] = {PREBUILT_WORKLOAD_LABEL: "dtjob-rn50"}
    assert prebuilt_workload(body) == "dtjob-rn50"
    spec = parse_spec(body, CONFIG)
    assert spec.run_policy.scheduling.queue_name is None and registry.schedulers(spec) == ()


ADMITTED = {"type": "Admitted", "status": "True", "reason": "Admitted"}
# MultiKueue's copy of the manager's Workload on a worker, as Kueue there admitted it.
ADMISSION: dict[str, Any] = {
    "admission": {"clusterQueue": "cq", "podSetAssignments": []},
    "conditions": [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"}, ADMITTED],
}


def _prebuilt(kube: RecordingKube, status: dict[str, Any] | None = None) -> dict[str, Any]:
    workload = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": WORKLOAD,
                "metadata": {"name": "dtjob-rn50", "namespace": "ml", "generation": 2,
                             "labels": {"kueue.x-k8s.io/multikueue-origin": "multikueue"}},
                "status": ADMISSION if status is None else status}  # fmt: skip
    return kube.put(workload)


def _copy() -> dict[str, Any]:
    body = job_body(**QUEUED)
    body["metadata"]["labels"] = {PREBUILT_WORKLOAD_LABEL: "dtjob-rn50"}
    return body


@pytest.mark.parametrize(("phase", "reason"), [("Succeeded", "Succeeded"), ("Failed", "Failed")])
def test_the_prebuilt_workload_is_marked_finished_when_the_copy_ends(phase: str, reason: str) -> None:
    kube = RecordingKube()
    _prebuilt(kube)
    finish_prebuilt(kube, _copy(), JobStatus(phase=phase, message="done"), NOW)
    conditions = kube.objects[(WORKLOAD, "ml", "dtjob-rn50")]["status"]["conditions"]
    assert conditions[:2] == ADMISSION["conditions"]
    assert conditions[2] == {
        "type": "Finished", "status": "True", "reason": reason, "message": "done",
        "lastTransitionTime": "2026-05-01T12:00:00Z", "observedGeneration": 2,
    }  # fmt: skip
    # Marked once: the next reconcile of the ended job reads it and writes nothing.
    finish_prebuilt(kube, _copy(), JobStatus(phase=phase, message="done"), NOW)
    assert [c for c in kube.writes() if c[1] == WORKLOAD] == [("patch-status", WORKLOAD, "dtjob-rn50")]


def test_a_running_copy_or_a_job_of_its_own_leaves_workloads_alone() -> None:
    kube = RecordingKube()
    _prebuilt(kube)
    finish_prebuilt(kube, _copy(), JobStatus(phase="Running"), NOW)
    finish_prebuilt(kube, job_body(), JobStatus(phase="Succeeded"), NOW)
    assert kube.calls == []
    finish_prebuilt(kube, _copy(), JobStatus(phase="Succeeded"), NOW)
    assert kube.objects[(WORKLOAD, "ml", "dtjob-rn50")]["status"]["conditions"][-1]["type"] == "Finished"


def test_finished_conditions_replace_a_false_finished() -> None:
    workload = {"status": {"conditions": [{"type": "Finished", "status": "False"}]}}
    conditions = finished_conditions(workload, "Failed", "", NOW) or []
    assert [(c["type"], c["status"], c["reason"]) for c in conditions] == [("Finished", "True", "Failed")]
    assert conditions[0]["message"] == "the job failed"
    assert finished_conditions({"status": {"conditions": conditions}}, "Failed", "", NOW) is None


OUTPUT = {
    "endpoint": "http://127.0.0.1:1/acct1",
    "container": "results",
    "credentials": {"authMode": "accountKey", "secretRef": {"name": "storage-key"}},
}
ENDED = JobStatus(phase="Succeeded", completion_time="2026-05-01T11:59:00Z")


@pytest.mark.parametrize(
    ("status", "done"),
    [
        (JobStatus(phase="Running"), False),
        (ENDED, False),  # its logs are still to be uploaded
        (replace(ENDED, logs_uploaded=True), False),  # its SAS Secrets are still there
        (replace(ENDED, logs_uploaded=True, sas_secrets_deleted=True), True),
        (replace(ENDED, completion_time="2026-05-01T11:50:00Z", sas_secrets_deleted=True), True),  # gave up
        (replace(ENDED, logs_uploaded=True, sas_secrets_deleted=True, results_pod="rn50-worker-0"), False),
    ],
)
def test_a_copy_is_done_only_once_its_logs_secrets_and_results_are_seen_to(
    status: JobStatus, done: bool
) -> None:
    spec = parse_spec(job_body(output=OUTPUT), CONFIG)
    assert wound_down(spec, status, NOW) == done
    kube = RecordingKube()
    _prebuilt(kube)
    finish_prebuilt(kube, _copy(), status, NOW, wound_down(spec, status, NOW))
    assert bool(kube.writes()) == done


def test_a_copy_without_output_is_done_as_it_ends() -> None:
    assert wound_down(job_spec(), ENDED, NOW)
    assert not wound_down(job_spec(), replace(ENDED, phase="Pending"), NOW)
