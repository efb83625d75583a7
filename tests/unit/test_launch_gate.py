"""The launcher: a pod the operator makes with its world, held by the operator's scheduling gate. The gate on
it whatever a template says, what counts as held, its release by UID, and how it goes (by UID, a stale one
of an older world before the next is made under its name)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from dtjob import desired, names
from dtjob.machine import decide
from dtjob.machine.launch import launcher_deletes
from dtjob.machine.stale import FORCE_DELETE_AFTER
from dtjob.reconcile.deletes import remove_pod_gate
from dtjob.state.decision import (
    CreateLauncher,
    CreateWorker,
    DeleteLauncher,
    DeletePod,
    EnsureWorld,
    ForceDeletePod,
)
from dtjob.state.observed import (
    LauncherState,
    Observed,
    launcher_state,
    legacy_launcher_state,
    observe_children,
    pod_state,
)
from dtjob.state.status import JobStatus
from dtjob.timefmt import format_time

from tests.unit.operator_fixtures import job_spec
from tests.unit.recording_kube import RecordingKube

OWNER = {"apiVersion": "dtjob.io/v1", "kind": "DistributedTrainingJob", "name": "rn50", "uid": "uid-job"}
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def template_gates(**launcher: Any) -> list[str]:
    return [
        g["name"]
        for g in desired.launcher_pod(job_spec(launcher=launcher), OWNER, 0)["spec"]["schedulingGates"]
    ]


def test_the_launcher_is_a_pod_of_the_launchers_name_owned_by_the_job_and_held() -> None:
    pod = desired.launcher_pod(job_spec(workers=3), OWNER, 2)
    assert (pod["apiVersion"], pod["kind"]) == ("v1", "Pod")
    meta = pod["metadata"]
    # No generated suffix: one launcher per job at a time, its name its hostname.
    assert meta["name"] == names.launcher_name("rn50") == "rn50-launcher" and meta["namespace"] == "ml"
    assert meta["ownerReferences"] == [OWNER]
    # The world's size was the Job's label: now the pod's, so that an edit of spec.workers is told apart.
    labels = meta["labels"]
    assert labels[names.WORLD_SIZE_LABEL] == "3"
    assert (labels[names.ROLE_LABEL], labels[names.ATTEMPT_LABEL]) == (names.ROLE_LAUNCHER, "2")
    assert labels[names.JOB_NAME_LABEL] == "rn50"
    assert pod["spec"]["schedulingGates"] == [{"name": names.LAUNCH_GATE}]
    assert pod["spec"]["restartPolicy"] == "Never"  # its end is the world's outcome
    # None asked for: only the count of its world's Kueue pod group (three workers and itself).
    assert meta["annotations"] == {"kueue.x-k8s.io/pod-group-total-count": "4"}
    # What the observer reads back from it is what the operator wrote.
    seen = launcher_state(pod_state(pod))
    assert seen.held and seen.world_size == 3 and seen.attempt == 2 and seen.is_launcher


def test_the_gate_comes_first_once_whatever_the_template_says() -> None:
    assert template_gates() == [names.LAUNCH_GATE]
    assert template_gates(template={"spec": {"schedulingGates": []}}) == [names.LAUNCH_GATE]
    # A template's own gate holds the launcher longer; naming ours cannot move or double it.
    own = {"spec": {"schedulingGates": [{"name": "team.io/hold"}, {"name": names.LAUNCH_GATE}]}}
    assert template_gates(template=own) == [names.LAUNCH_GATE, "team.io/hold"]


def pod(name: str, *gates: str, phase: str = "Pending", uid: str = "uid-p", **status: Any) -> dict[str, Any]:
    labels = {names.ROLE_LABEL: names.ROLE_LAUNCHER, names.ATTEMPT_LABEL: "0", names.WORLD_SIZE_LABEL: "2"}
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": uid, "labels": labels},
        "spec": {"schedulingGates": [{"name": g} for g in gates]},
        "status": {"phase": phase, **status},
    }


def test_a_launcher_is_held_until_its_pod_is_released() -> None:
    held = launcher_state(pod_state(pod("rn50-launcher", names.LAUNCH_GATE)))
    assert held.held and held.held_pod is not None and held.held_pod.name == "rn50-launcher"
    assert not held.launched and held.pod is not None and held.pod.uid == "uid-p" and not held.legacy_job
    # Only the operator's gate counts: Kueue's, or a template's, is not a hold of the operator's.
    other = launcher_state(pod_state(pod("rn50-launcher", "team.io/hold")))
    assert not other.held and other.held_pod is None
    released = launcher_state(pod_state(pod("rn50-launcher")))
    assert not released.held and released.launched
    # A held pod being deleted is released no more.
    going = pod("rn50-launcher", names.LAUNCH_GATE)
    going["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:30Z"
    gone = launcher_state(pod_state(going))
    assert gone.deleting and gone.held_pod is None


def test_the_launchers_phase_is_the_launch() -> None:
    running = launcher_state(pod_state(pod("rn50-launcher", phase="Running")))
    assert running.running and not running.finished and running.pod_name == "rn50-launcher"
    assert running.world_size == 2 and running.reason is None
    done = launcher_state(pod_state(pod("rn50-launcher", phase="Succeeded")))
    assert done.succeeded and done.finished and not done.failed and done.failed_pod is None
    ended = {"name": "launcher", "state": {"terminated": {"exitCode": 2, "reason": "Error"}}}
    crashed = launcher_state(pod_state(pod("rn50-launcher", phase="Failed", containerStatuses=[ended])))
    assert crashed.failed and not crashed.running and crashed.reason == "Error, exit code 2"
    assert crashed.failed_pod is not None and crashed.failed_pod.exit_code == 2
    # A pod that failed without saying why still fails, with a reason to show.
    bare = launcher_state(pod_state(pod("rn50-launcher", phase="Failed")))
    assert bare.failed and bare.reason


def test_a_legacy_launcher_job_is_held_until_a_pod_of_it_is_released_or_runs() -> None:
    """A launcher Job that an earlier release of the operator made: its pods were the Job controller's."""
    job = {"metadata": {"name": "rn50-launcher", "labels": {names.ATTEMPT_LABEL: "0"}}, "status": {}}
    held = legacy_launcher_state(job, [pod_state(pod("rn50-launcher-a", names.LAUNCH_GATE))])
    assert held.held and held.held_pod is not None and held.held_pod.name == "rn50-launcher-a"
    assert held.legacy_job and held.pod is None
    # No pod yet: the Job controller has not made it, and nothing has launched.
    assert legacy_launcher_state(job, []).held
    other = legacy_launcher_state(job, [pod_state(pod("rn50-launcher-a", "team.io/hold"))])
    assert not other.held and other.held_pod is None
    released = legacy_launcher_state(job, [pod_state(pod("rn50-launcher-a"))])
    assert not released.held and released.launched
    ready = legacy_launcher_state({**job, "status": {"ready": 1}}, [])
    assert ready.launched


def test_the_launcher_is_the_jobs_own_pod_of_the_launchers_name() -> None:
    mine = pod("rn50-launcher", names.LAUNCH_GATE)
    mine["metadata"]["ownerReferences"] = [{"uid": "uid-job"}]
    seen = observe_children([mine], None, "uid-job", "rn50-launcher").launcher
    assert seen is not None and seen.held and seen.pod is not None and seen.pod.name == "rn50-launcher"
    # Another owner's pod under the name (an older job's, not yet collected) is never taken for it ...
    theirs = {**mine, "metadata": {**mine["metadata"], "ownerReferences": [{"uid": "uid-old-job"}]}}
    assert observe_children([theirs], None, "uid-job", "rn50-launcher").launcher is None
    # ... nor a pod of another name or role.
    other = {**mine, "metadata": {**mine["metadata"], "name": "rn50-launcher-x"}}
    assert observe_children([other], None, "uid-job", "rn50-launcher").launcher is None
    worker = {**mine, "metadata": {**mine["metadata"], "labels": {names.ROLE_LABEL: names.ROLE_WORKER}}}
    assert observe_children([worker], None, "uid-job", "rn50-launcher").launcher is None


def launcher_pod_state(phase: str = "Running", **kw: Any) -> LauncherState:
    return launcher_state(replace(pod_state(pod("rn50-launcher", phase=phase, uid="uid-l")), **kw))


def test_a_launcher_goes_as_its_pod_by_uid_and_a_legacy_one_as_its_job() -> None:
    assert launcher_deletes(launcher_pod_state()) == [DeletePod("rn50-launcher", "uid-l")]
    legacy = LauncherState(0, deleting=False, running=True, succeeded=False, failed=False, legacy_job=True)
    assert launcher_deletes(legacy) == [DeleteLauncher()]
    # Already going, or none: nothing more to do.
    assert launcher_deletes(launcher_pod_state(deleting=True)) == []
    assert launcher_deletes(replace(legacy, deleting=True)) == []
    assert launcher_deletes(None) == []
    # A torchrun world's launch is one of its workers: it goes as a worker, never as a launcher.
    torchrun = replace(launcher_pod_state(), role=names.ROLE_WORKER)
    assert launcher_deletes(torchrun) == []


RESTARTING = JobStatus(phase="Restarting", restarts=1, start_time=format_time(NOW - timedelta(minutes=5)))


def stale_launcher(**kw: Any) -> Observed:
    """The launcher pod of attempt 0, seen while the world of attempt 1 is made."""
    old = launcher_pod_state(**kw)
    assert old.pod is not None
    return Observed(pods=(old.pod,), launcher=old)


def test_a_stale_launcher_pod_goes_by_uid_before_the_next_one_is_made_under_its_name() -> None:
    next_world = [EnsureWorld(), CreateWorker(0, 1), CreateWorker(1, 1)]
    d = decide(job_spec(), stale_launcher(), RESTARTING, NOW)
    assert d.actions == [DeletePod("rn50-launcher", "uid-l"), *next_world]  # no CreateLauncher(1) yet
    # Still terminating within its grace period: nothing is made under its name, nor deleted again.
    going = stale_launcher(deleting=True, deletion_deadline=NOW + timedelta(seconds=20))
    d = decide(job_spec(), going, RESTARTING, NOW)
    assert d.actions == next_world
    gone = decide(job_spec(), Observed(), RESTARTING, NOW)
    assert gone.actions == [*next_world, CreateLauncher(1)]


def test_a_stale_launcher_pod_stuck_terminating_past_its_grace_period_is_force_deleted() -> None:
    deadline = NOW - timedelta(seconds=5)
    stuck = stale_launcher(deleting=True, deletion_deadline=deadline)
    # Within the margin: wait, and look again when it runs out (a stuck pod sends no event).
    d = decide(job_spec(), stuck, RESTARTING, NOW)
    assert not any(isinstance(a, ForceDeletePod | CreateLauncher) for a in d.actions)
    assert d.requeue_after == pytest.approx((FORCE_DELETE_AFTER - timedelta(seconds=5)).total_seconds())
    # Past it (its node lost, no kubelet to confirm): force-deleted by UID; the next comes once it is gone.
    later = NOW + FORCE_DELETE_AFTER
    d = decide(job_spec(), stuck, RESTARTING, later)
    overdue = (later - deadline).total_seconds()
    assert ForceDeletePod("rn50-launcher", "uid-l", overdue) in d.actions
    assert not any(isinstance(a, CreateLauncher | DeletePod) for a in d.actions)


def test_the_release_takes_off_the_first_gate_without_a_read() -> None:
    kube = RecordingKube()
    kube.put(pod("rn50-launcher", names.LAUNCH_GATE, "team.io/hold"))
    assert remove_pod_gate(kube, "ml", "rn50-launcher", "uid-p", names.LAUNCH_GATE)
    assert kube.calls == [("patch", "Pod", "rn50-launcher")]
    left = kube.objects[("Pod", "ml", "rn50-launcher")]["spec"]["schedulingGates"]
    assert left == [{"name": "team.io/hold"}]


def test_a_gate_a_webhook_put_first_is_kept_and_ours_found_by_a_read() -> None:
    kube = RecordingKube()
    kube.put(pod("rn50-launcher", "webhook.io/first", names.LAUNCH_GATE))
    assert remove_pod_gate(kube, "ml", "rn50-launcher", "uid-p", names.LAUNCH_GATE)
    assert [c[0] for c in kube.calls] == ["patch", "get", "patch"]
    left = kube.objects[("Pod", "ml", "rn50-launcher")]["spec"]["schedulingGates"]
    assert left == [{"name": "webhook.io/first"}]


def test_a_pod_made_again_under_the_name_is_not_released_for_the_one_observed() -> None:
    kube = RecordingKube()
    kube.put(pod("rn50-launcher", names.LAUNCH_GATE, uid="uid-new"))
    assert not remove_pod_gate(kube, "ml", "rn50-launcher", "uid-old", names.LAUNCH_GATE)
    gates = kube.objects[("Pod", "ml", "rn50-launcher")]["spec"]["schedulingGates"]
    assert gates == [{"name": names.LAUNCH_GATE}]
