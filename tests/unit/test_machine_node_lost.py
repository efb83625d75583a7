"""A worker's node lost: the state machine names the loss, counts it once, and does not wait forever for a pod
that no kubelet will ever finish terminating."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from dtjob.machine import decide, with_results
from dtjob.machine.stale import FORCE_DELETE_AFTER
from dtjob.reconcile.job import reconcile
from dtjob.state.decision import CreateLauncher, CreateWorker, EnsureWorld, ForceDeletePod, PodForceDeleted
from dtjob.state.observed import Children, LauncherState, Observed, PodState, launcher_state, observe_children
from dtjob.state.status import JobStatus
from dtjob.timefmt import format_time

from tests.unit.operator_fixtures import CONFIG, job_body, job_spec
from tests.unit.recording_kube import JOB_KIND, RecordingKube

NOW = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
EVICTED = "DeletionByTaintManager: Taint manager: deleting due to NoExecute taint"
COLLECTED = "DeletionByPodGC: PodGC: node no longer exists"


def worker(i: int, attempt: int = 0, **kw: Any) -> PodState:
    fields: dict[str, Any] = {
        "name": f"rn50-worker-{i}", "role": "worker", "attempt": attempt, "index": i, "phase": "Running",
        "scheduled": True, "ready": True, "deleting": False, "uid": f"uid-w{i}-a{attempt}",
    }  # fmt: skip
    fields.update(kw)
    return PodState(**fields)


def running_launcher(attempt: int = 0) -> LauncherState:
    """The world's launcher, running, from its own pod (which goes with its world, by UID)."""
    pod = PodState(name="rn50-launcher", role="launcher", attempt=attempt, index=None, phase="Running",
                   scheduled=True, ready=True, deleting=False, uid=f"uid-l-a{attempt}")  # fmt: skip
    return launcher_state(pod)


def running(phase: str = "Running", **kw: Any) -> JobStatus:
    return JobStatus(phase=phase, start_time=format_time(NOW - timedelta(minutes=5)), **kw)


def test_a_worker_evicted_from_a_lost_node_restarts_the_world_naming_why() -> None:
    evicted = worker(1, deleting=True, deletion_deadline=NOW + timedelta(seconds=30), disruption=EVICTED)
    d = decide(job_spec(), Observed(pods=(worker(0), evicted), launcher=running_launcher()), running(), NOW)
    assert d.status.phase == "Restarting" and d.status.restarts == 1
    cond = d.status.condition("Restarting")
    assert cond is not None and cond.reason == "WorkerLost"
    lost = f"worker pod rn50-worker-1 was lost while the launcher was running: {EVICTED}"
    assert cond.message.startswith(lost)


def test_a_worker_failed_by_the_pod_garbage_collector_is_lost_not_failed() -> None:
    # A deleted node's pods are marked Failed with a DisruptionTarget condition, then removed.
    collected = worker(1, phase="Failed", ready=False, disruption=COLLECTED)
    d = decide(job_spec(), Observed(pods=(worker(0), collected), launcher=running_launcher()), running(), NOW)
    cond = d.status.condition("Restarting")
    assert cond is not None and cond.reason == "WorkerLost"
    assert cond.message.startswith(f"worker pod rn50-worker-1 was lost: {COLLECTED}")
    # A container that failed on its own is still a failure.
    crashed = worker(1, phase="Failed", ready=False, reason="Error, exit code 1")
    d = decide(job_spec(), Observed(pods=(worker(0), crashed), launcher=running_launcher()), running(), NOW)
    assert (d.status.condition("Restarting") or d.status).reason == "WorkerFailed"


def test_the_loss_is_counted_once_while_the_old_pod_lingers() -> None:
    # After the restart the evicted pod of attempt 0 is still terminating: it blocks its name, nothing more.
    prev = running(restarts=1, phase="Restarting")
    lingering = worker(1, deleting=True, deletion_deadline=NOW + timedelta(seconds=20), disruption=EVICTED)
    d = decide(job_spec(), Observed(pods=(lingering,)), prev, NOW)
    assert d.status.restarts == 1 and d.status.phase == "Restarting"
    assert d.actions == [EnsureWorld(), CreateWorker(0, 1), CreateLauncher(1)]
    assert "waiting for 1 old pod(s) to terminate" in d.status.message


def test_a_pod_stuck_terminating_past_its_grace_period_is_force_deleted() -> None:
    prev = running(restarts=1, phase="Restarting")
    deadline = NOW - timedelta(seconds=5)
    stuck = worker(1, deleting=True, deletion_deadline=deadline, disruption=EVICTED)
    # Within the margin: wait, and look again when it runs out (a stuck pod sends no event).
    d = decide(job_spec(), Observed(pods=(worker(0, attempt=1), stuck)), prev, NOW)
    assert not any(isinstance(a, ForceDeletePod) for a in d.actions)
    assert d.requeue_after == (FORCE_DELETE_AFTER - timedelta(seconds=5)).total_seconds()
    # Past it: force-deleted (only that pod, by UID), and its name is reused once it is gone.
    later = NOW + FORCE_DELETE_AFTER
    d = decide(job_spec(), Observed(pods=(worker(0, attempt=1), stuck)), prev, later)
    overdue = (later - deadline).total_seconds()
    assert d.actions == [ForceDeletePod("rn50-worker-1", "uid-w1-a0", overdue), CreateLauncher(1)]
    gone = decide(job_spec(), Observed(pods=(worker(0, attempt=1),)), prev, later)
    assert gone.actions == [EnsureWorld(), CreateWorker(1, 1), CreateLauncher(1)]
    # A pod that is still within its grace period is left to its kubelet.
    fresh = replace(stuck, deletion_deadline=NOW + timedelta(seconds=25))
    d = decide(job_spec(), Observed(pods=(worker(0, attempt=1), fresh)), prev, NOW)
    assert not any(isinstance(a, ForceDeletePod) for a in d.actions)


def test_a_force_deletion_is_said_once_it_happened() -> None:
    status, events = with_results(running(), [PodForceDeleted("rn50-worker-1", 61.0)])
    assert status == running()
    assert [(e.type, e.reason) for e in events] == [("Warning", "PodForceDeleted")]
    assert events[0].message.startswith("rn50-worker-1 was still terminating 61s after its grace period")


def test_observe_reads_the_deletion_deadline_and_the_disruption() -> None:
    pod = {
        "metadata": {
            "name": "rn50-worker-1", "uid": "u-1", "deletionTimestamp": "2025-01-01T12:00:30Z",
            "labels": {"dtjob.io/role": "worker", "dtjob.io/attempt": "0", "dtjob.io/worker-index": "1"},
        },
        "status": {"phase": "Running", "conditions": [
            {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
             "message": "Taint manager: deleting due to NoExecute taint"},
            {"type": "Ready", "status": "False"},
        ]},
    }  # fmt: skip
    state = observe_children([pod], None).pods[0]
    assert state.uid == "u-1" and state.deleting
    assert state.deletion_deadline == NOW + timedelta(seconds=30)
    assert state.disruption == EVICTED and state.reason == EVICTED
    plain = observe_children([{"metadata": {"name": "p"}, "status": {"phase": "Running"}}], None).pods[0]
    assert plain.deletion_deadline is None and plain.disruption is None


def test_a_reconcile_force_deletes_the_stuck_pod_and_says_so() -> None:
    kube = RecordingKube()
    body = job_body()
    prev = running(phase="Restarting", restarts=1, workers_total=2)
    kube.put({**body, "kind": JOB_KIND, "status": prev.to_dict()})
    stuck = {
        "kind": "Pod",
        "metadata": {
            "name": "rn50-worker-1", "namespace": "ml", "uid": "u-old",
            "deletionTimestamp": format_time(NOW - FORCE_DELETE_AFTER - timedelta(seconds=1)),
            "ownerReferences": [{"uid": "uid-1"}],
            "labels": {"dtjob.io/role": "worker", "dtjob.io/attempt": "0", "dtjob.io/worker-index": "1"},
        },
        "status": {"phase": "Running"},
    }  # fmt: skip
    kube.put(stuck)
    reconcile(kube, CONFIG, "ml", "rn50", Children(pods=(stuck,)), NOW)
    assert ("force-delete", "Pod", "rn50-worker-1") in kube.writes()
    assert ("Pod", "ml", "rn50-worker-1") not in kube.objects
    assert ("Warning", "PodForceDeleted") in kube.events
    # The world's other worker is created meanwhile; the lost one's name is free at the next pass.
    assert ("create", "Pod", "rn50-worker-0") in kube.writes()
    assert ("create", "Pod", "rn50-worker-1") not in kube.writes()
