"""Why admission refused a launcher's or stager's pod, from the FailedCreate Events' watch: kept by the
Event's own namespace and the Job it names, the newest message per Job, deletions and re-lists followed; the
job that owns the Job is reconciled when one arrives, and its reconcile reads no Event from the API server."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from dtjob.reconcile.observe import observe
from dtjob.runtime import failed_creates
from dtjob.runtime.controller import CHILD_EVENTS_BATCH_S, Controller
from dtjob.runtime.failed_creates import FailedCreates, event_projection
from dtjob.state.observed import Children
from dtjob.state.status import JobStatus

from tests.unit import recording_kube
from tests.unit.operator_fixtures import CONFIG, job_body, job_spec
from tests.unit.test_controller_queue import A, B, RecordingKube, StubReconcile, run, settle, until

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def failed_create(name: str, job_uid: str, message: str, at: str, namespace: str = "ns") -> dict[str, Any]:
    return event_projection({
        "metadata": {"name": name, "namespace": namespace, "uid": f"e-{name}", "resourceVersion": "1"},
        "involvedObject": {"kind": "Job", "namespace": namespace, "uid": job_uid},
        "reason": "FailedCreate", "message": message, "lastTimestamp": at,
    })  # fmt: skip


def launcher(job: str, uid: str) -> dict[str, Any]:
    labels = {"dtjob.io/job-name": job, "dtjob.io/role": "launcher"}
    return {"metadata": {"name": f"{job}-launcher", "namespace": "ns", "uid": uid, "resourceVersion": "1",
                         "labels": labels}}  # fmt: skip


def test_the_newest_message_of_each_job_is_kept_and_a_deletion_takes_its_event_away() -> None:
    store = FailedCreates()
    assert store.messages("ns", ["j1"]) is None, "not listed yet: the reconcile reads them itself"
    assert store.replace("ns", [failed_create("old", "j1", "quota: 1 used", "2026-12-03T10:00:00Z")]) == {
        ("ns", "j1")
    }
    assert store.observe(failed_create("new", "j1", "quota: 2 used", "2026-12-03T10:05:00Z"), False)
    assert store.messages("ns", ["j1", "j2"]) == {"j1": "quota: 2 used"}
    assert store.observe(failed_create("new", "j1", "", "2026-12-03T10:05:00Z"), True) == ("ns", "j1")
    assert store.messages("ns", ["j1"]) == {"j1": "quota: 1 used"}
    assert store.observe(failed_create("never-seen", "j1", "", ""), True) is None
    assert store.messages("other", ["j1"]) is None, "another namespace's watch has not listed"


def test_an_event_counts_only_for_a_job_of_its_own_namespace() -> None:
    """The whole cluster's watch brings every namespace's Events; one written in `theirs` that names a Job
    of `ns` (its uid read by anyone who may get Jobs there) must not say that Job's pod was refused."""
    store = FailedCreates()
    store.replace(None, [])
    forged = failed_create("forged", "j1", "violates PodSecurity", "2026-12-03T10:00:00Z", namespace="theirs")
    assert store.observe(forged, False) == ("theirs", "j1")
    assert store.messages("ns", ["j1"]) == {}
    assert store.messages("theirs", ["j1"]) == {"j1": "violates PodSecurity"}


def test_a_relist_forgets_what_was_deleted_while_no_watch_ran_in_its_scope_only() -> None:
    store = FailedCreates()
    store.replace("ns", [failed_create("a", "j1", "refused", "t1")])
    store.replace("cv", [failed_create("b", "j2", "refused", "t1", namespace="cv")])
    assert store.replace("ns", []) == {("ns", "j1")}
    assert store.messages("ns", ["j1"]) == {} and store.messages("cv", ["j2"]) == {"j2": "refused"}
    assert store.replace("cv", [failed_create("b", "j2", "refused", "t1", namespace="cv")]) == set()


def test_a_failed_create_reconciles_the_job_that_owns_the_job_and_hands_it_the_message() -> None:
    kube = RecordingKube()
    kube.children = [("jobs", launcher("a", "la")), ("jobs", launcher("b", "lb"))]

    async def test(controller: Controller, stub: StubReconcile) -> None:
        controller.start()
        controller.enqueue(A)
        await until(lambda: stub.count(A) == 1)
        assert stub.last_seen(A).failed_creates is None, "not listed yet: the reconcile reads the Events"
        controller.failed_creates_listed("events", "ns", [])
        await settle(CHILD_EVENTS_BATCH_S * 2)
        assert stub.count(A) == 1 and stub.count(B) == 0, "an empty list changes no job"
        controller.observe_failed_create("events", failed_create("e", "la", "exceeded quota", "t1"), False)
        await until(lambda: stub.count(A) == 2)
        assert stub.last_seen(A).failed_creates == {"la": "exceeded quota"}
        elsewhere = failed_create("x", "lb", "violates PodSecurity", "t1", namespace="theirs")
        controller.observe_failed_create("events", elsewhere, False)
        await settle(CHILD_EVENTS_BATCH_S * 2)
        assert stub.count(B) == 0, "an Event of another namespace names no job here"

    run(test, kube=kube)


def test_a_watched_namespace_reads_no_event_and_an_unwatched_one_reads_them() -> None:
    """The reconcile of a job whose legacy launcher Job (an earlier release's) has no pod asks why: from the
    watch's messages where the watch serves the namespace (no read of the API server), else with a LIST of the
    Job's Events."""
    job = job_body()
    waiting = {"metadata": {"name": "rn50-launcher", "uid": "lj", "labels": {"dtjob.io/attempt": "0"},
                            "ownerReferences": [{"uid": job["metadata"]["uid"]}],
                            "creationTimestamp": "2026-12-03T11:59:00Z"}, "status": {}}  # fmt: skip
    prev = JobStatus(phase="Starting")
    kube = recording_kube.RecordingKube(failed_creates={"lj": "exceeded quota: pods (read)"})
    watched = Children(launcher=waiting, failed_creates={"lj": "exceeded quota: pods (watched)"})
    seen = observe(kube, CONFIG, job_spec(), job, prev, watched, NOW)
    assert seen.launcher_refused is not None and seen.launcher_refused.message.endswith("(watched)")
    assert not [call for call in kube.calls if call[1] == "Event"]
    seen = observe(kube, CONFIG, job_spec(), job, prev, replace(watched, failed_creates={}), NOW)
    assert seen.launcher_refused is None and not [call for call in kube.calls if call[1] == "Event"]
    seen = observe(kube, CONFIG, job_spec(), job, prev, replace(watched, failed_creates=None), NOW)
    assert seen.launcher_refused is not None and seen.launcher_refused.message.endswith("(read)")
    assert [call[:2] for call in kube.calls if call[1] == "Event"] == [("list", "Event")]


def test_past_its_bound_a_namespace_whose_event_was_not_kept_is_read_until_a_list_fits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Anyone who may post Events can post FailedCreate ones; past MAX_KEPT the store keeps no more, and the
    namespace that lost one is read from the API server rather than answered without it."""
    monkeypatch.setattr(failed_creates, "MAX_KEPT", 2)
    store = FailedCreates()
    store.replace(None, [failed_create("a", "j1", "one", "t1"), failed_create("b", "j2", "two", "t1")])
    store.observe(failed_create("c", "j3", "three", "t1", namespace="cv"), False)
    assert store.messages("cv", ["j3"]) is None, "its Event was not kept: read it"
    assert store.messages("ns", ["j1"]) == {"j1": "one"}, "a namespace that lost none is still served"
    store.observe(failed_create("a", "j1", "", ""), True)
    store.replace(
        None, [failed_create("b", "j2", "two", "t1"), failed_create("c", "j3", "three", "t1", "cv")]
    )
    assert store.messages("cv", ["j3"]) == {"j3": "three"}


def test_an_event_naming_a_uid_no_job_can_have_is_not_kept_nor_counted() -> None:
    """The API server takes any string as an Event's involvedObject.uid, up to the object's 1.5 MiB: kept, a
    few hundred such Events posted by anyone who may post Events would hold the operator's memory past its
    limit (at every start too, from the LIST). No Job has such a uid, so the store keeps nothing of them."""
    store = FailedCreates()
    store.replace(None, [failed_create("big-listed", "u" * 1_000_000, "x", "t1")])
    huge = failed_create("big", "u" * (failed_creates.JOB_UID_MAX_CHARS + 1), "refused", "t1")
    assert huge["involvedObject"] == {"uid": None}, "the projection drops it before it is handed over"
    assert store.observe(huge, False) is None
    uid = "0f9c6b1e-7d1a-4c52-9a8e-3b7c2d4e5f60"  # the API server's kind
    assert store.observe(failed_create("real", uid, "exceeded quota: pods", "t1"), False) == ("ns", uid)
    assert store.messages("ns", [uid, "u" * 1_000_000]) == {uid: "exceeded quota: pods"}
    assert len(store._keys) == 1, "only the Event that names a Job's uid is kept"
