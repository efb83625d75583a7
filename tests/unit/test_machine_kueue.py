"""Kueue's pod-group integration in the state machine: gated workers wait for admission, an eviction
(preemption) suspends the world without spending runPolicy.backoffLimit, and the world comes back when Kueue
admits it again; pods of ours that Kueue's finalizer would hold are released once they ended."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from dtjob import desired
from dtjob.machine import decide
from dtjob.machine.admission import admitted_group
from dtjob.state.decision import (
    CreateLauncher,
    CreateWorker,
    DeleteLauncher,
    DeletePod,
    EnsureWorld,
    FinishKueueGroup,
    ReleaseLauncher,
    ReleasePod,
)
from dtjob.state.observed import LauncherState, Observed, PodState, launcher_state, observe_children
from dtjob.state.status import JobStatus
from dtjob.timefmt import format_time

from tests.unit.operator_fixtures import job_spec

NOW = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
QUEUED = {"runPolicy": {"scheduling": {"queueName": "team-a"}, "backoffLimit": 0}}
EVICTION = (
    "Preempted: Preempted to accommodate a workload (UID: u-9) due to prioritization in the ClusterQueue"
)


def worker(i: int, attempt: int = 0, **kw: Any) -> PodState:
    fields: dict[str, Any] = {
        "name": f"rn50-worker-{i}", "role": "worker", "attempt": attempt, "index": i, "phase": "Running",
        "scheduled": True, "ready": True, "deleting": False, "uid": f"uid-w{i}", "kueue_finalizer": True,
        "kueue_group_size": 3,  # two workers and the launcher
    }  # fmt: skip
    fields.update(kw)
    return PodState(**fields)


def gated(i: int, **kw: Any) -> PodState:
    return worker(i, phase="Pending", scheduled=False, ready=False, gated=True, **kw)


def stopped(i: int, **kw: Any) -> PodState:
    """A worker Kueue stopped: TerminationTarget True, then deleted (its finalizer keeps it a while)."""
    return worker(i, deleting=True, kueue_eviction=EVICTION, **kw)


def launcher(failed: bool = False, **kw: Any) -> LauncherState:
    """The world's launcher, from its pod: a member of Kueue's group (Kueue's finalizer on it)."""
    phase = "Failed" if failed else "Running"
    fields: dict[str, Any] = {"name": "rn50-launcher", "role": "launcher", "index": None, "phase": phase,
                              "ready": not failed, "uid": "uid-l", "kueue_group_open": True}  # fmt: skip
    return launcher_state(worker(0, **{**fields, **kw}))


def held_launcher(**kw: Any) -> LauncherState:
    """The next world's launcher: made with its workers, gated by Kueue and held by the operator."""
    fields: dict[str, Any] = {"phase": "Pending", "scheduled": False, "ready": False, "gated": True,
                              "held": True}  # fmt: skip
    return launcher(**{**fields, **kw})


def running() -> JobStatus:
    return JobStatus(
        phase="Running", start_time=format_time(NOW - timedelta(minutes=5)), launcher_pod="rn50-launcher"
    )


def test_gated_workers_wait_for_admission_and_say_so() -> None:
    d = decide(job_spec(**QUEUED), Observed(pods=(gated(0), gated(1))), JobStatus(phase="Pending"), NOW)
    assert d.status.phase == "Pending"
    assert d.status.message == "0/2 workers ready; 2 worker pod(s) wait for admission by Kueue"
    # The launcher is made with its gated workers: Kueue counts the group only once all of it exists.
    assert d.actions == [CreateLauncher(0)]
    d = decide(
        job_spec(**QUEUED), Observed(pods=(gated(0), gated(1)), launcher=held_launcher()), d.status, NOW
    )
    assert d.actions == [] and d.status.phase == "Pending"
    # Admitted (the gates off) and every worker Ready: the operator lets its launcher go.
    d = decide(job_spec(**QUEUED), Observed(pods=(worker(0), worker(1)), launcher=held_launcher(gated=False)),
               d.status, NOW)  # fmt: skip
    assert d.actions == [ReleaseLauncher("rn50-launcher", "uid-l")]


def test_a_preemption_suspends_the_world_without_spending_the_backoff_limit() -> None:
    # backoffLimit 0: a counted failure would fail the job at once.
    observed = Observed(pods=(stopped(0), stopped(1, phase="Failed")), launcher=launcher(failed=True))
    d = decide(job_spec(**QUEUED), observed, running(), NOW)
    assert d.status.phase == "Suspended" and d.status.restarts == 0
    cond = d.status.condition("Suspended")
    assert cond is not None and cond.status == "True" and cond.reason == "Preempted"
    assert EVICTION in cond.message
    assert d.status.launcher_pod is None and d.status.start_time is None
    # The launcher (failed as its workers went) is deleted, not judged; the ended worker is released.
    assert d.actions == [ReleasePod("rn50-worker-1", "uid-w1"), DeletePod("rn50-launcher", "uid-l")]
    assert ("Warning", "Preempted") in [(e.type, e.reason) for e in d.events]


def test_a_preemption_seen_first_on_the_launcher_suspends_the_world_too() -> None:
    """Kueue stops every pod of the group, the launcher among them, one by one: the first it marked may be
    the launcher, whose end must not be taken for the world's failure (backoffLimit 0 here)."""
    evicted = launcher(failed=True, deleting=True, kueue_eviction=EVICTION)
    d = decide(job_spec(**QUEUED), Observed(pods=(worker(0), worker(1)), launcher=evicted), running(), NOW)
    assert d.status.phase == "Suspended" and d.status.restarts == 0
    cond = d.status.condition("Suspended")
    assert cond is not None and cond.reason == "Preempted" and EVICTION in cond.message
    # Kueue stops the workers itself; the ended launcher's finalizer comes off, so that its name is free.
    assert d.actions == [ReleasePod("rn50-launcher", "uid-l")]


def test_a_preemption_deletes_a_legacy_launcher_job_as_the_job() -> None:
    """A launcher Job that an earlier release of the operator made goes as the Job (its pod with it)."""
    legacy = replace(launcher(failed=True), pod=None, legacy_job=True)
    observed = Observed(pods=(stopped(0), stopped(1, phase="Failed")), launcher=legacy)
    d = decide(job_spec(**QUEUED), observed, running(), NOW)
    assert d.status.phase == "Suspended"
    assert d.actions == [ReleasePod("rn50-worker-1", "uid-w1"), DeleteLauncher()]


def test_the_preempted_world_is_created_again_and_waits_gated_then_resumes() -> None:
    spec = job_spec(**QUEUED)
    first = decide(spec, Observed(pods=(stopped(0), stopped(1))), running(), NOW)
    # The old pods are gone: the world is made again, launcher included (Kueue's webhook gates them all).
    d = decide(spec, Observed(), first.status, NOW)
    assert d.status.phase == "Suspended" and d.status.restarts == 0
    assert d.actions == [EnsureWorld(), CreateWorker(0, 0), CreateWorker(1, 0), CreateLauncher(0)]
    d = decide(spec, Observed(pods=(gated(0), gated(1)), launcher=held_launcher()), d.status, NOW)
    assert d.status.phase == "Suspended" and d.actions == []  # the next world's launcher is kept
    assert d.status.message == "preempted by Kueue; waiting for admission in LocalQueue team-a"
    # Admitted again: the gates are off, the world goes on as a fresh start of the same attempt.
    back = Observed(pods=(worker(0), worker(1)), launcher=held_launcher(gated=False))
    d = decide(spec, back, d.status, NOW)
    cond = d.status.condition("Suspended")
    assert cond is not None and cond.status == "False" and cond.reason == "Admitted"
    assert d.status.restarts == 0 and d.status.phase in ("Starting", "Pending")
    assert ReleaseLauncher("rn50-launcher", "uid-l") in d.actions


def test_the_old_worlds_launcher_goes_and_its_name_waits_for_it() -> None:
    """An evicted launcher still terminating (Kueue's finalizer, its pod not ended yet) holds the name: no new
    one is made until it is gone."""
    spec = job_spec(**QUEUED)
    first = decide(spec, Observed(pods=(stopped(0), stopped(1))), running(), NOW)
    going = launcher(deleting=True, kueue_eviction=EVICTION)
    d = decide(spec, Observed(launcher=going), first.status, NOW)
    assert d.status.phase == "Suspended"
    assert not any(isinstance(a, CreateLauncher | DeletePod | ReleasePod) for a in d.actions), d.actions


def test_a_worker_that_failed_on_its_own_still_counts() -> None:
    # No TerminationTarget from Kueue: the usual failure path, which spends the backoff limit.
    crashed = worker(1, phase="Failed", ready=False, reason="Error, exit code 1")
    d = decide(job_spec(**QUEUED), Observed(pods=(worker(0), crashed), launcher=launcher()), running(), NOW)
    assert d.status.phase == "Failed"


def test_a_restart_releases_the_old_pods_that_kueue_holds() -> None:
    prev = JobStatus(phase="Restarting", restarts=1, start_time=format_time(NOW))
    ended = worker(0, deleting=True, phase="Failed", deletion_deadline=NOW + timedelta(seconds=20))
    running_still = worker(1, deleting=True, deletion_deadline=NOW + timedelta(seconds=20))
    d = decide(job_spec(**QUEUED), Observed(pods=(ended, running_still)), prev, NOW)
    # Only the one that has ended: Kueue counts a Running pod as the group's until its kubelet ends it.
    assert ReleasePod("rn50-worker-0", "uid-w0") in d.actions
    assert ReleasePod("rn50-worker-1", "uid-w1") not in d.actions
    assert not any(isinstance(a, DeletePod) for a in d.actions)


def test_observe_reads_the_gate_the_finalizer_and_kueues_stop_condition() -> None:
    labels = {"dtjob.io/role": "worker", "dtjob.io/attempt": "0", "dtjob.io/worker-index": "0"}
    pod = {
        "metadata": {"name": "rn50-worker-0", "labels": labels, "finalizers": ["kueue.x-k8s.io/managed"],
                     "deletionTimestamp": "2025-01-01T12:00:30Z"},
        "spec": {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]},
        "status": {"phase": "Running", "conditions": [
            {"type": "TerminationTarget", "status": "True", "reason": "WorkloadEvictedDueToPreempted",
             "message": EVICTION.removeprefix("Preempted: ")},
        ]},
    }  # fmt: skip
    state = observe_children([pod], None).pods[0]
    assert state.gated and state.kueue_finalizer and state.kueue_eviction == EVICTION
    # Stopped for another reason (its Workload deleted, not admitted): no eviction to wait out.
    pod["status"]["conditions"][0]["reason"] = "WorkloadDeleted"
    assert observe_children([pod], None).pods[0].kueue_eviction is None
    bare = observe_children([{"metadata": {"name": "p", "labels": labels}}], None).pods[0]
    assert not bare.gated and not bare.kueue_finalizer and bare.kueue_eviction is None


def test_a_finished_jobs_deleted_workers_are_released_so_kueue_frees_the_quota() -> None:
    prev = JobStatus(phase="Succeeded", start_time=format_time(NOW), completion_time=format_time(NOW))
    ended = worker(0, deleting=True, phase="Failed")
    d = decide(job_spec(**QUEUED), Observed(pods=(ended, worker(1, kueue_finalizer=False))), prev, NOW)
    assert ReleasePod("rn50-worker-0", "uid-w0") in d.actions
    assert not any(isinstance(a, ReleasePod) and a.name == "rn50-worker-1" for a in d.actions)


def test_the_launcher_kept_after_the_end_is_marked_so_that_kueue_finishes_the_group() -> None:
    """An MPI world's workers never succeed (they are deleted) and its launcher pod stays for its log: Kueue's
    group would wait for all its pods to succeed, holding the quota. The operator marks the kept launcher
    once, and Kueue finishes the group as soon as none of its pods is active."""
    done = launcher(phase="Succeeded", ready=False)
    # In the pass that ends the job already: with cleanPodPolicy None no pod event need come again.
    for policy in ("Running", "None"):
        kept = job_spec(runPolicy={**QUEUED["runPolicy"], "cleanPodPolicy": policy})
        d = decide(kept, Observed(pods=(worker(0), worker(1)), launcher=done), running(), NOW)
        assert d.status.phase == "Succeeded" and FinishKueueGroup("rn50-launcher", "uid-l") in d.actions
    prev = JobStatus(phase="Succeeded", start_time=format_time(NOW), completion_time=format_time(NOW))
    spec = job_spec(**QUEUED)
    d = decide(spec, Observed(pods=(worker(0, deleting=True, phase="Failed"),), launcher=done), prev, NOW)
    assert FinishKueueGroup("rn50-launcher", "uid-l") in d.actions
    assert ReleasePod("rn50-worker-0", "uid-w0") in d.actions
    marked = launcher(phase="Succeeded", ready=False, kueue_group_open=False)
    for left in (marked, launcher(phase="Succeeded", ready=False, kueue_finalizer=False)):
        # Marked already, or Kueue has finished the group (its finalizer is off): nothing more to write.
        d = decide(spec, Observed(launcher=left), prev, NOW)
        assert not any(isinstance(a, FinishKueueGroup) for a in d.actions), d.actions
    # A launcher deleted with its job's end (cleanPodPolicy All) is released once it ended, not marked.
    going = launcher(phase="Succeeded", ready=False, deleting=True)
    d = decide(spec, Observed(launcher=going), prev, NOW)
    assert d.actions.count(ReleasePod("rn50-launcher", "uid-l")) == 1
    assert not any(isinstance(a, FinishKueueGroup) for a in d.actions)


def test_observe_reads_kueues_group_and_its_mark_on_the_launcher() -> None:
    labels = {"dtjob.io/role": "launcher", "dtjob.io/attempt": "0", "kueue.x-k8s.io/pod-group-name": "rn50"}
    pod: dict[str, Any] = {"metadata": {"name": "rn50-launcher", "labels": labels, "annotations": {}}}
    assert observe_children([pod], None).pods[0].kueue_group_open
    pod["metadata"]["annotations"]["kueue.x-k8s.io/retriable-in-group"] = "false"
    assert not observe_children([pod], None).pods[0].kueue_group_open
    del labels["kueue.x-k8s.io/pod-group-name"]  # no member of a group: nothing to finish
    pod["metadata"]["annotations"] = {}
    assert not observe_children([pod], None).pods[0].kueue_group_open


def test_a_queued_world_an_earlier_release_made_gets_its_launcher_outside_the_group_once_admitted() -> None:
    """An earlier release made a queued world's workers a group of their own (its count: the workers) and its
    launcher only once that group was admitted. A launcher joining that group would be a member Kueue never
    admits: the upgraded operator makes it as that release did."""
    spec = job_spec(**QUEUED)
    d = decide(
        spec, Observed(pods=(gated(0, kueue_group_size=2), gated(1, kueue_group_size=2))), JobStatus(), NOW
    )
    assert not any(isinstance(a, CreateLauncher) for a in d.actions), d.actions
    admitted = Observed(pods=(worker(0, kueue_group_size=2), worker(1, kueue_group_size=2)))
    d = decide(spec, admitted, d.status, NOW)
    assert CreateLauncher(0, outside_kueue_group=True) in d.actions
    # The group this release makes counts the launcher: it joins, and is made with its workers.
    d = decide(
        spec, Observed(pods=(gated(0, kueue_group_size=3), gated(1, kueue_group_size=3))), JobStatus(), NOW
    )
    assert CreateLauncher(0) in d.actions


def test_a_world_an_earlier_release_left_to_a_default_queue_pod_by_pod_gets_its_launcher_outside() -> None:
    """An earlier release put a job that names no queue in no pod group: a namespace's default LocalQueue took
    each of its pods as a Workload of its own. A launcher joining a group of three would wait for two members
    that never come: it is made as that release made it, once its workers are admitted."""
    spec = job_spec()
    alone: dict[str, Any] = {"kueue_group_size": None}
    d = decide(spec, Observed(pods=(gated(0, **alone), gated(1, **alone))), JobStatus(), NOW)
    assert not any(isinstance(a, CreateLauncher) for a in d.actions), d.actions
    d = decide(spec, Observed(pods=(worker(0, **alone), worker(1, **alone))), d.status, NOW)
    assert CreateLauncher(0, outside_kueue_group=True) in d.actions
    # Workers in no group that Kueue does not manage (no Kueue here): the launcher is made as this release
    # makes it, with them.
    plain: dict[str, Any] = {"kueue_group_size": None, "kueue_finalizer": False}
    d = decide(spec, Observed(pods=(worker(0, **plain), worker(1, **plain))), JobStatus(), NOW)
    assert CreateLauncher(0) in d.actions


def test_a_suspended_world_releases_its_ended_pods_so_that_kueue_frees_the_quota() -> None:
    """runPolicy.suspend deletes the world and makes no replacement: Kueue would keep its finalizer on the
    pods, and the Workload its quota, for as long as the job stays suspended."""
    spec = job_spec(runPolicy={**QUEUED["runPolicy"], "suspend": True})
    gone = launcher(failed=True, deleting=True)
    observed = Observed(
        pods=(worker(0, deleting=True, phase="Failed"), worker(1, deleting=True)), launcher=gone
    )
    d = decide(spec, observed, running(), NOW)
    assert d.status.phase == "Suspended"
    assert (
        ReleasePod("rn50-worker-0", "uid-w0") in d.actions
        and ReleasePod("rn50-launcher", "uid-l") in d.actions
    )
    assert ReleasePod("rn50-worker-1", "uid-w1") not in d.actions  # still running: Kueue counts it active


def test_an_edit_of_the_workers_while_the_world_waits_for_admission_makes_it_again_in_one_group() -> None:
    """Kueue makes no Workload of a pod group whose members disagree on its size: workers made for the old
    size would keep the edited world waiting for good. Those Kueue still gates are made again, in one
    group."""
    spec = job_spec(**{**QUEUED, "workers": 1})  # edited from 2: the group is one worker and the launcher
    d = decide(spec, Observed(pods=(gated(0), gated(1))), JobStatus(phase="Pending"), NOW)
    assert (
        DeletePod("rn50-worker-0", "uid-w0") in d.actions
        and DeletePod("rn50-worker-1", "uid-w1") in d.actions
    )
    assert not any(isinstance(a, (CreateLauncher, CreateWorker)) for a in d.actions), d.actions
    # Never placed: Kueue's finalizer comes off at once, so that the name is free for the new group.
    going = worker(0, phase="Pending", scheduled=False, ready=False, gated=True, deleting=True)
    d = decide(spec, Observed(pods=(going,)), d.status, NOW)
    assert ReleasePod("rn50-worker-0", "uid-w0") in d.actions
    d = decide(spec, Observed(pods=()), d.status, NOW)
    assert CreateWorker(0, 0) in d.actions and CreateLauncher(0) in d.actions
    # A world Kueue admitted keeps its size until its next world: no pod of the group is made again, its
    # launcher (held until every worker is Ready) included.
    made_for_two = held_launcher(gated=False, world_size=2)
    admitted = Observed(pods=(worker(0, ready=False), worker(1, ready=False)), launcher=made_for_two)
    d = decide(spec, admitted, JobStatus(phase="Pending"), NOW)
    assert not any(isinstance(a, (DeletePod, DeleteLauncher, CreateLauncher)) for a in d.actions), d.actions
    ready = Observed(pods=(worker(0), worker(1)), launcher=made_for_two)
    assert ReleaseLauncher("rn50-launcher", "uid-l") in decide(spec, ready, d.status, NOW).actions


def _pod(name: str, role: str, *, index: int | None = None, **meta: Any) -> dict[str, Any]:
    labels = {"dtjob.io/role": role, "dtjob.io/attempt": "0", **meta.pop("labels", {})}
    if index is not None:
        labels["dtjob.io/worker-index"] = str(index)
    return {"metadata": {"name": name, "uid": f"uid-{name}", "labels": labels, **meta},
            "spec": {}, "status": {"phase": "Pending"}}  # fmt: skip


def test_a_world_size_label_no_spec_could_give_makes_no_more_workers() -> None:
    """A namespace admin may label the held launcher `dtjob.io/world-size: 1000000000` and put Kueue's
    finalizer on a worker (the world then reads as admitted, keeping the launcher's size): the operator would
    have made a billion workers, its memory gone on every reconcile of the job. A size past spec.workers'
    bound is no size the operator wrote: the world is the spec's."""
    spec = job_spec(**QUEUED)  # two workers
    huge = _pod("rn50-launcher", "launcher", labels={"dtjob.io/world-size": "1000000000"})
    huge["spec"]["schedulingGates"] = [{"name": "dtjob.io/workers-ready"}]
    taken = _pod("rn50-worker-0", "worker", index=0, finalizers=["kueue.x-k8s.io/managed"])
    observed = observe_children([huge, taken], None, launcher_name="rn50-launcher")
    assert observed.launcher is not None and observed.launcher.world_size is None
    d = decide(spec, observed, JobStatus(phase="Pending"), NOW)
    assert [a for a in d.actions if isinstance(a, CreateWorker)] == [CreateWorker(1, 0)], d.actions
    # The bound is spec.workers' own: the largest world the spec allows is still read.
    for value, read in (("512", 512), ("513", None), ("0", None), ("-3", None)):
        huge["metadata"]["labels"]["dtjob.io/world-size"] = value
        found = observe_children([huge], None, launcher_name="rn50-launcher").launcher
        assert found is not None and found.world_size == read, (value, found)


def test_an_edit_to_one_worker_more_is_regrouped_once_the_added_worker_disagrees() -> None:
    """Two workers counted with their launcher (3) look, to an edit to 3 workers, like a group an earlier
    release made (its count the workers alone): kept at first. Once the added worker counts 4, they go."""
    spec = job_spec(**{**QUEUED, "workers": 3})
    d = decide(spec, Observed(pods=(gated(0), gated(1))), JobStatus(phase="Pending"), NOW)
    assert not any(isinstance(a, DeletePod) for a in d.actions) and CreateWorker(2, 0) in d.actions
    added = gated(2, kueue_group_size=4)
    d = decide(spec, Observed(pods=(gated(0), gated(1), added)), d.status, NOW)
    deleted = {a.name for a in d.actions if isinstance(a, DeletePod)}
    assert deleted == {"rn50-worker-0", "rn50-worker-1"}, d.actions
    assert not any(isinstance(a, CreateLauncher) for a in d.actions), d.actions


def test_an_elastic_world_kueue_admitted_keeps_its_size_when_spec_workers_is_edited() -> None:
    """Kueue has no elastic pod groups: it deletes a member made for a group of another size. An elastic
    world that took an edit of spec.workers as it ran made that worker again every few seconds, for good.
    Once admitted, the world keeps its size, its lost workers replaced in the admitted group; the edit waits
    for the next world, and the status says so."""
    spec = job_spec(**{**QUEUED, "workers": 3, "elastic": {"minWorkers": 1, "maxWorkers": 3}})  # was 2
    made_for_two = launcher(world_size=2)
    observed = Observed(pods=(worker(0), worker(1)), launcher=made_for_two)
    world = admitted_group(spec, observed, 0)
    assert (world.workers, world.edited_workers) == (2, 3)
    d = decide(world, observed, running(), NOW)
    assert not any(isinstance(a, CreateWorker) for a in d.actions), d.actions
    said = d.status.message
    assert said.endswith("(spec.workers=3 applies at the next world: Kueue admitted this one at 2)"), said
    # A worker lost: its replacement joins the admitted group, counted as its other members are.
    lost = decide(world, Observed(pods=(worker(0),), launcher=made_for_two), running(), NOW)
    assert CreateWorker(1, 0) in lost.actions and lost.status.restarts == 0
    counted = desired.worker_pod(world, {"uid": "uid-1"}, 1, 0)["metadata"]["annotations"]
    assert counted["kueue.x-k8s.io/pod-group-total-count"] == "3"  # two workers and the launcher
    # Still queued (gated), the edit applies: the gated workers are made again in a group of its size.
    queued = Observed(pods=(gated(0), gated(1)), launcher=held_launcher(world_size=2))
    assert admitted_group(spec, queued, 0) is spec
    # No Kueue (no finalizer): an elastic world takes the edit as it runs.
    free = tuple(worker(i, kueue_finalizer=False, kueue_group_size=None) for i in (0, 1))
    assert admitted_group(spec, Observed(pods=free, launcher=made_for_two), 0) is spec
    # A size no spec.elastic bound allows is no size the world was made with.
    forged = Observed(pods=(worker(0), worker(1)), launcher=launcher(world_size=9))
    assert admitted_group(spec, forged, 0) is spec


def test_a_fixed_world_admitted_before_its_launch_makes_a_lost_worker_again_in_the_admitted_group() -> None:
    """spec.workers edited to 3 after Kueue admitted a world of 2 that has not launched yet: the world keeps
    its size, and a worker it loses before the launch comes back counted in the admitted group (a member
    counted for a group of 4 is one Kueue deletes, and the operator would make it again, for good)."""
    spec = job_spec(**{**QUEUED, "workers": 3})
    made_for_two = held_launcher(gated=False, world_size=2)
    observed = Observed(pods=(worker(0, ready=False),), launcher=made_for_two)
    world = admitted_group(spec, observed, 0)
    assert (world.workers, world.edited_workers) == (2, 3)
    d = decide(world, observed, JobStatus(phase="Pending"), NOW)
    assert [a for a in d.actions if isinstance(a, CreateWorker)] == [CreateWorker(1, 0)], d.actions
    counted = desired.worker_pod(world, {"uid": "uid-1"}, 1, 0)["metadata"]["annotations"]
    assert counted["kueue.x-k8s.io/pod-group-total-count"] == "3"
    # Launched, it says the edit waits for the next world, once.
    ready = Observed(pods=(worker(0), worker(1)), launcher=launcher(world_size=2))
    said = decide(admitted_group(spec, ready, 0), ready, running(), NOW).status.message
    waits = "(spec.workers=3 applies at the next world: Kueue admitted this one at 2)"
    assert said == f"training: 8 ranks on 2 workers {waits}", said
