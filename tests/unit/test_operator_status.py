"""The job state machine, one transition per test."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from dtjob.machine import decide, invalid_spec
from dtjob.state.decision import (
    CreateLauncher,
    CreateWorker,
    DeleteJob,
    DeleteLauncher,
    DeletePod,
    EnsureWorld,
    ReleaseLauncher,
    UploadLogs,
)
from dtjob.state.observed import Blocker, LauncherState, Observed, PodState, launcher_state
from dtjob.state.observed import observe_children as observe
from dtjob.state.status import JobStatus, status_from_dict
from dtjob.timefmt import format_time

from tests.unit.operator_fixtures import job_spec

NOW = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)


def worker(i: int, attempt: int = 0, phase: str = "Running", ready: bool = True, **kw: Any) -> PodState:
    return PodState(
        name=f"rn50-worker-{i}", role="worker", attempt=attempt, index=i, phase=phase,
        scheduled=phase != "Pending" or kw.pop("scheduled", False), ready=ready,
        deleting=kw.pop("deleting", False), reason=kw.pop("reason", None),
    )  # fmt: skip


LAUNCHER = "rn50-launcher"


def launcher(attempt: int = 0, **kw: Any) -> LauncherState:
    """The launcher as its own pod says (running unless told otherwise); the pod goes by its UID."""
    defaults: dict[str, Any] = {
        "deleting": False, "running": True, "succeeded": False, "failed": False, "pod_name": LAUNCHER,
    }  # fmt: skip
    defaults.update(kw)
    phase = next((p for p, on in (("Running", "running"), ("Succeeded", "succeeded"), ("Failed", "failed"))
                  if defaults[on]), "Pending")  # fmt: skip
    defaults.setdefault("pod", PodState(
        name=defaults["pod_name"], role="launcher", attempt=attempt, index=None, phase=phase,
        scheduled=phase != "Pending", ready=phase == "Running", deleting=defaults["deleting"],
        uid="uid-launcher",
    ))  # fmt: skip
    return LauncherState(attempt=attempt, **defaults)


def gone_launcher() -> DeletePod:
    """How the launcher() pod goes with its world."""
    return DeletePod(LAUNCHER, "uid-launcher")


def held(world_size: int | None = None, deleting: bool = False) -> LauncherState:
    """A launcher pod made with its world (of `world_size` workers, as its label says), still gated."""
    return launcher_state(PodState(name=LAUNCHER, role="launcher", attempt=0, index=None, phase="Pending",
                                   scheduled=False, ready=False, deleting=deleting, reason=None,
                                   uid="uid-launcher", held=True, world_size=world_size))  # fmt: skip


def started(**kw: Any) -> JobStatus:
    return JobStatus(
        phase=kw.pop("phase", "Running"), start_time=format_time(NOW - timedelta(seconds=10)), **kw
    )


def test_new_job_creates_world_workers_and_its_held_launcher() -> None:
    d = decide(job_spec(), Observed(generation=1), JobStatus(), NOW)
    assert d.actions == [EnsureWorld(), CreateWorker(0, 0), CreateWorker(1, 0), CreateLauncher(0)]
    assert d.status.launcher_state == "Pending"
    assert d.status.phase == "Pending"
    assert d.status.start_time == format_time(NOW)
    assert d.status.is_true("Created")
    assert d.status.observed_generation == 1
    assert d.status.to_dict()["workersReady"] == "0/2"
    assert d.events == []  # Pending is a routine step of every start: the status says it, no event


def test_a_start_posts_one_event_running_and_none_for_its_routine_steps() -> None:
    """Pending and Starting show in the phase and the conditions; an event each would be two more writes
    per job on the API server. Entering Running posts one."""
    spec = job_spec()
    placed = Observed(pods=(worker(0, ready=False, reason="ContainersNotReady"), worker(1, ready=False)))
    starting = decide(spec, placed, started(phase="Pending"), NOW)
    ready = decide(spec, Observed(pods=(worker(0), worker(1))), starting.status, NOW)
    pending_launcher = launcher(running=False)
    named = decide(spec, Observed(pods=(worker(0), worker(1)), launcher=pending_launcher), ready.status, NOW)
    running = decide(spec, Observed(pods=(worker(0), worker(1)), launcher=launcher()), named.status, NOW)
    assert [starting.status.phase, ready.status.phase, named.status.phase] == ["Starting"] * 3
    assert starting.events == ready.events == named.events == []
    assert named.status == ready.status  # the launcher's pod, not yet running, costs no patch of its own
    assert running.status.phase == "Running"
    assert [(e.type, e.reason) for e in running.events] == [("Normal", "Running")]


def test_the_launchers_pod_is_named_with_its_running_state() -> None:
    spec = job_spec()
    workers = (worker(0), worker(1))
    waiting = Observed(pods=workers, launcher=launcher(running=False))
    pending = decide(spec, waiting, started(phase="Starting"), NOW)
    assert pending.status.launcher_state == "Pending" and pending.status.launcher_pod is None
    running = decide(spec, Observed(pods=workers, launcher=launcher()), pending.status, NOW)
    assert running.status.launcher_pod == LAUNCHER


def test_a_launcher_pod_deleted_before_it_ran_is_created_again_not_lost() -> None:
    spec = job_spec()
    workers = (worker(0), worker(1))
    waiting = Observed(pods=workers, launcher=launcher(running=False))
    pending = decide(spec, waiting, started(phase="Starting"), NOW)
    gone = decide(spec, Observed(pods=workers), pending.status, NOW)
    assert gone.actions == [CreateLauncher(0)]
    assert gone.status.restarts == 0 and gone.status.phase == "Starting"
    running = decide(spec, Observed(pods=workers, launcher=launcher()), pending.status, NOW)
    lost = decide(spec, Observed(pods=workers), running.status, NOW)
    assert lost.status.phase == "Restarting" and lost.status.condition("Restarting").reason == "LauncherLost"


def test_a_blocker_in_a_routine_phase_still_posts_its_warning() -> None:
    blocker = Blocker("SecretNotFound", "secret data-sas not found")
    d = decide(job_spec(), Observed(generation=1, blocker=blocker), JobStatus(), NOW)
    assert d.status.phase == "Pending"
    assert [(e.type, e.reason) for e in d.events] == [("Warning", "SecretNotFound")]


def test_same_inputs_twice_create_nothing_new() -> None:
    spec = job_spec()
    obs = Observed(pods=(worker(0), worker(1)))
    first = decide(spec, obs, started(phase="Starting"), NOW)
    assert first.actions == [CreateLauncher(0)]
    again = decide(spec, obs, first.status, NOW)
    assert again.status == first.status
    assert again.events == []


def test_a_new_worlds_status_holds_once_its_workers_exist() -> None:
    # Written before the creates, it already says what the pass after them would: no second status write.
    spec = job_spec()
    first = decide(spec, Observed(), JobStatus(), NOW)
    assert first.actions == [EnsureWorld(), CreateWorker(0, 0), CreateWorker(1, 0), CreateLauncher(0)]
    assert first.status.message == "0/2 workers ready"
    created = (worker(0, phase="Pending", ready=False), worker(1, phase="Pending", ready=False))
    after = decide(spec, Observed(pods=created, launcher=held()), first.status, NOW)
    assert after.actions == [] and after.status == first.status
    # A worker replaced in a world that has the others says so.
    d = decide(spec, Observed(pods=created[:1], launcher=held()), first.status, NOW)
    assert d.actions == [EnsureWorld(), CreateWorker(1, 0)]
    assert d.status.message == "0/2 workers ready; creating 1 worker pod(s)"


def test_launcher_waits_for_every_worker_ready() -> None:
    spec = job_spec()
    obs = Observed(pods=(worker(0), worker(1, ready=False, reason="ContainersNotReady")), launcher=held())
    d = decide(spec, obs, started(phase="Pending"), NOW)
    assert d.actions == []  # the launcher's pod stays held
    assert d.status.phase == "Starting" and d.status.launcher_state == "Pending"
    assert "1/2 workers ready" in d.status.message and "rn50-worker-1" in d.status.message


def test_every_worker_ready_releases_the_held_launcher_pod() -> None:
    spec = job_spec()
    d = decide(spec, Observed(pods=(worker(0), worker(1)), launcher=held()), started(phase="Starting"), NOW)
    assert d.actions == [ReleaseLauncher(LAUNCHER, "uid-launcher")]
    assert d.status.phase == "Starting" and d.status.message == "all workers ready; launcher starting"
    # A legacy launcher Job whose pod the Job controller has not made yet: nothing to release until it has.
    legacy = replace(held(), held_pod=None, pod=None, legacy_job=True)
    d = decide(spec, Observed(pods=(worker(0), worker(1)), launcher=legacy), d.status, NOW)
    assert d.actions == []


def test_a_workers_edit_before_the_launch_makes_the_held_launcher_again_for_the_new_size() -> None:
    spec = job_spec(workers=3)
    prev = started(phase="Starting")
    d = decide(spec, Observed(pods=(worker(0), worker(1)), launcher=held(world_size=2)), prev, NOW)
    assert d.actions == [gone_launcher(), EnsureWorld(), CreateWorker(2, 0)]
    # Its name is the new one's: nothing is made under it while the old pod is still going.
    going = held(world_size=2, deleting=True)
    d = decide(spec, Observed(pods=(worker(0), worker(1), worker(2)), launcher=going), d.status, NOW)
    assert d.actions == []
    gone = decide(spec, Observed(pods=(worker(0), worker(1), worker(2))), d.status, NOW)
    assert gone.actions == [CreateLauncher(0)]
    # Once launched, the world keeps its size: the edit waits for the next world.
    launched = replace(launcher(), world_size=2)
    d = decide(spec, Observed(pods=(worker(0), worker(1)), launcher=launched), started(), NOW)
    assert d.actions == [] and d.status.phase == "Running"


def test_a_worker_gone_before_the_launch_is_made_again_not_a_broken_world() -> None:
    prev = started(phase="Starting")
    d = decide(job_spec(), Observed(pods=(worker(0),), launcher=held()), prev, NOW)
    assert d.actions == [EnsureWorld(), CreateWorker(1, 0)] and d.status.restarts == 0
    # Once released, the launch has begun: a worker gone breaks the world.
    released = launcher(running=False)
    d = decide(job_spec(), Observed(pods=(worker(0),), launcher=released), prev, NOW)
    assert d.status.restarts == 1
    cond = d.status.condition("Restarting")
    assert cond is not None and cond.reason == "WorkerLost"


def test_unscheduled_worker_keeps_pending_with_reason() -> None:
    pending = worker(1, phase="Pending", ready=False, reason="Unschedulable: 0/6 nodes are available")
    d = decide(job_spec(), Observed(pods=(worker(0), pending)), started(phase="Pending"), NOW)
    assert d.status.phase == "Pending"
    assert "Unschedulable" in d.status.message


def test_all_ready_creates_launcher_then_running() -> None:
    spec = job_spec()
    obs = Observed(pods=(worker(0), worker(1)), launcher=launcher())
    d = decide(spec, obs, started(phase="Starting"), NOW)
    assert d.actions == []
    assert d.status.phase == "Running" and d.status.is_true("Running")
    assert d.status.launcher_state == "Running"


def test_launcher_success_finishes_and_cleans_running_workers() -> None:
    obs = Observed(pods=(worker(0), worker(1)), launcher=launcher(running=False, succeeded=True))
    d = decide(job_spec(), obs, started(), NOW)
    assert d.status.phase == "Succeeded" and d.status.is_true("Succeeded")
    assert not d.status.is_true("Running")
    assert d.status.completion_time == format_time(NOW)
    assert d.actions == [DeletePod("rn50-worker-0"), DeletePod("rn50-worker-1")]
    assert "rn50-launcher" in d.status.message


def test_clean_pod_policy_none_and_all() -> None:
    obs = Observed(pods=(worker(0), worker(1)), launcher=launcher(running=False, succeeded=True))
    none = decide(job_spec(runPolicy={"cleanPodPolicy": "None"}), obs, started(), NOW)
    assert none.actions == []
    every = decide(job_spec(runPolicy={"cleanPodPolicy": "All"}), obs, started(), NOW)
    assert every.actions == [DeletePod("rn50-worker-0"), DeletePod("rn50-worker-1"), gone_launcher()]
    # A launcher Job that an earlier release of the operator made goes as the Job.
    legacy = replace(obs, launcher=launcher(running=False, succeeded=True, pod=None, legacy_job=True))
    every = decide(job_spec(runPolicy={"cleanPodPolicy": "All"}), legacy, started(), NOW)
    assert every.actions == [DeletePod("rn50-worker-0"), DeletePod("rn50-worker-1"), DeleteLauncher()]
    # One already going is not deleted again.
    going = replace(obs, launcher=launcher(running=False, succeeded=True, deleting=True))
    assert decide(job_spec(runPolicy={"cleanPodPolicy": "All"}), going, started(), NOW).actions == [
        DeletePod("rn50-worker-0"), DeletePod("rn50-worker-1"),
    ]  # fmt: skip


def test_worker_failure_restarts_world_naming_the_pod() -> None:
    failed = worker(1, phase="Failed", ready=False, reason="Error, exit code 1")
    obs = Observed(pods=(worker(0), failed), launcher=launcher())
    d = decide(job_spec(), obs, started(), NOW)
    assert d.status.phase == "Restarting" and d.status.restarts == 1
    cond = d.status.condition("Restarting")
    assert cond is not None and cond.status == "True" and cond.reason == "WorkerFailed"
    assert "rn50-worker-1" in cond.message and "exit code 1" in cond.message
    assert set(d.actions) == {DeletePod("rn50-worker-0"), DeletePod("rn50-worker-1"), gone_launcher()}
    assert any(e.type == "Warning" and "rn50-worker-1" in e.message for e in d.events)


def test_restart_waits_for_old_pods_then_recreates_with_new_attempt() -> None:
    spec = job_spec()
    prev = started(phase="Restarting", restarts=1)
    old = Observed(pods=(worker(0, deleting=True), worker(1, phase="Failed", ready=False, deleting=True)))
    waiting = decide(spec, old, prev, NOW)
    assert waiting.actions == []
    assert waiting.status.phase == "Restarting"
    assert "old pod" in waiting.status.message
    gone = decide(spec, Observed(), prev, NOW)
    assert gone.actions == [EnsureWorld(), CreateWorker(0, 1), CreateWorker(1, 1), CreateLauncher(1)]
    # A stale pod of attempt 0 that is not yet deleting gets deleted, and its name is not reused yet.
    stale = decide(spec, Observed(pods=(worker(0, attempt=0),)), prev, NOW)
    assert stale.actions == [DeletePod("rn50-worker-0"), EnsureWorld(), CreateWorker(1, 1), CreateLauncher(1)]


def test_recovery_after_restart_is_running_again() -> None:
    prev = started(phase="Restarting", restarts=1)
    prev = replace(
        prev,
        conditions=decide(
            job_spec(), Observed(pods=(worker(0, phase="Failed", ready=False),)), started(), NOW
        ).status.conditions,
    )
    obs = Observed(pods=(worker(0, attempt=1), worker(1, attempt=1)), launcher=launcher(attempt=1))
    d = decide(job_spec(), obs, prev, NOW)
    assert d.status.phase == "Running"
    cond = d.status.condition("Restarting")
    assert cond is not None and cond.status == "False" and cond.reason == "Recovered"
    assert any(e.reason == "Recovered" for e in d.events)


def test_failure_at_backoff_limit_fails_naming_the_pod() -> None:
    spec = job_spec(runPolicy={"backoffLimit": 1})
    failed = worker(0, attempt=1, phase="Failed", ready=False, reason="OOMKilled, exit code 137")
    obs = Observed(pods=(failed, worker(1, attempt=1)), launcher=launcher(attempt=1))
    d = decide(spec, obs, started(restarts=1), NOW)
    assert d.status.phase == "Failed" and d.status.restarts == 1
    cond = d.status.condition("Failed")
    assert cond is not None and cond.reason == "WorkerFailed"
    assert (
        "rn50-worker-0" in cond.message and "OOMKilled" in cond.message and "backoffLimit (1)" in cond.message
    )
    # The failed pod stays for its logs; the running worker and the launcher are cleaned up.
    assert d.actions == [DeletePod("rn50-worker-1"), gone_launcher()]


def test_launcher_failure_restarts() -> None:
    obs = Observed(
        pods=(worker(0), worker(1)),
        launcher=launcher(
            running=False, failed=True, reason="Error, exit code 1", pod_name="rn50-launcher-abc"
        ),
    )
    d = decide(job_spec(), obs, started(), NOW)
    cond = d.status.condition("Restarting")
    assert cond is not None and cond.reason == "LauncherFailed" and "rn50-launcher-abc" in cond.message


def test_worker_vanishing_under_running_launcher_is_a_failure() -> None:
    d = decide(job_spec(), Observed(pods=(worker(0),), launcher=launcher()), started(), NOW)
    cond = d.status.condition("Restarting")
    assert cond is not None and cond.reason == "WorkerLost" and "rn50-worker-1" in cond.message


def test_stale_failed_pod_of_old_attempt_does_not_restart_again() -> None:
    obs = Observed(pods=(worker(0, attempt=0, phase="Failed", ready=False),))
    d = decide(job_spec(), obs, started(phase="Restarting", restarts=1), NOW)
    assert d.status.restarts == 1
    assert DeletePod("rn50-worker-0") in d.actions


def test_deadline_exceeded() -> None:
    spec = job_spec(runPolicy={"activeDeadlineSeconds": 5})
    obs = Observed(pods=(worker(0), worker(1)), launcher=launcher())
    d = decide(spec, obs, started(), NOW)
    assert d.status.phase == "Failed"
    cond = d.status.condition("Failed")
    assert cond is not None and cond.reason == "DeadlineExceeded"


def test_deadline_not_yet_reached_requeues_at_deadline() -> None:
    spec = job_spec(runPolicy={"activeDeadlineSeconds": 60})
    d = decide(spec, Observed(pods=(worker(0), worker(1)), launcher=launcher()), started(), NOW)
    assert d.status.phase == "Running"
    assert d.requeue_after == 50


def test_suspend_deletes_pods_keeps_job_and_resume_recreates() -> None:
    obs = Observed(pods=(worker(0), worker(1)), launcher=launcher())
    spec = job_spec(runPolicy={"suspend": True})
    d = decide(spec, obs, started(), NOW)
    assert d.status.phase == "Suspended" and d.status.is_true("Suspended")
    assert set(d.actions) == {DeletePod("rn50-worker-0"), DeletePod("rn50-worker-1"), gone_launcher()}
    assert d.status.start_time is None
    resumed = decide(job_spec(), Observed(), d.status, NOW)
    assert resumed.actions == [EnsureWorld(), CreateWorker(0, 0), CreateWorker(1, 0), CreateLauncher(0)]
    assert not resumed.status.is_true("Suspended")
    assert any(e.reason == "Resumed" for e in resumed.events)
    assert resumed.status.restarts == 0


def test_suspended_before_start_creates_nothing() -> None:
    d = decide(job_spec(runPolicy={"suspend": True}), Observed(), JobStatus(), NOW)
    assert d.actions == [] and d.status.phase == "Suspended"


def test_waiting_blocker_keeps_pending_and_creates_nothing() -> None:
    blocker = Blocker("PVCNotFound", "spec.dataset.volume.persistentVolumeClaim.claimName: 'x' not found")
    d = decide(job_spec(), Observed(blocker=blocker), JobStatus(), NOW)
    assert d.actions == []
    assert d.status.phase == "Pending"
    cond = d.status.condition("Created")
    assert cond is not None and cond.status == "False" and cond.reason == "PVCNotFound"
    assert d.requeue_after == 15


def test_fatal_blocker_fails() -> None:
    blocker = Blocker("InsufficientGPUsPerNode", "spec.gpusPerWorker: 6 > 4", fatal=True)
    d = decide(job_spec(), Observed(blocker=blocker), JobStatus(), NOW)
    assert d.status.phase == "Failed" and d.actions == []
    assert "spec.gpusPerWorker" in d.status.message


def test_ttl_after_finished() -> None:
    spec = job_spec(runPolicy={"ttlSecondsAfterFinished": 30})
    done = JobStatus(phase="Succeeded", completion_time=format_time(NOW - timedelta(seconds=10)))
    waiting = decide(spec, Observed(), done, NOW)
    assert waiting.actions == [] and waiting.requeue_after == 20
    expired = decide(spec, Observed(), done, NOW + timedelta(seconds=25))
    assert expired.actions == [DeleteJob()]


def test_finished_job_stays_finished() -> None:
    done = JobStatus(phase="Failed", completion_time=format_time(NOW))
    d = decide(job_spec(), Observed(pods=(worker(0, phase="Failed", ready=False),)), done, NOW)
    assert d.status.phase == "Failed" and d.actions == [] and d.events == []


def test_invalid_spec_fails_with_field() -> None:
    d = invalid_spec(JobStatus(), "spec.workers", "must be >= 1", NOW, 2)
    assert d.status.phase == "Failed" and d.status.message == "spec.workers: must be >= 1"
    cond = d.status.condition("Failed")
    assert cond is not None and cond.reason == "InvalidSpec"


def test_status_round_trips_through_dict() -> None:
    d = decide(
        job_spec(),
        Observed(pods=(worker(0), worker(1)), generation=3),
        started(phase="Starting", restarts=2),
        NOW,
    )
    assert status_from_dict(d.status.to_dict()) == d.status


def test_condition_transition_time_moves_only_on_flip() -> None:
    obs = Observed(pods=(worker(0), worker(1)), launcher=launcher())
    first = decide(job_spec(), obs, started(phase="Starting"), NOW)
    later = decide(job_spec(), obs, first.status, NOW + timedelta(minutes=5))
    assert first.status.condition("Running") == later.status.condition("Running")


def test_observe_reads_raw_pods_and_the_launcher_from_its_own_pod() -> None:
    pod = {
        "metadata": {"name": "rn50-worker-0", "labels": {
            "dtjob.io/role": "worker", "dtjob.io/attempt": "1", "dtjob.io/worker-index": "0"}},
        "status": {
            "phase": "Failed",
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
            "containerStatuses": [{"state": {"terminated": {"exitCode": 1, "reason": "Error"}}}],
        },
    }  # fmt: skip
    labels = {"dtjob.io/role": "launcher", "dtjob.io/attempt": "1", "dtjob.io/world-size": "2"}
    launcher_pod: dict[str, Any] = {
        "metadata": {"name": LAUNCHER, "uid": "uid-launcher", "labels": labels},
        "status": {"phase": "Running"},
    }
    obs = observe([pod, launcher_pod], None, launcher_name=LAUNCHER)
    state = obs.pods[0]
    assert (state.attempt, state.index, state.phase, state.ready, state.scheduled) == (
        1,
        0,
        "Failed",
        False,
        True,
    )
    assert state.reason == "Error, exit code 1"
    found = obs.launcher
    assert found is not None and found.running and found.pod_name == LAUNCHER and not found.legacy_job
    assert (found.attempt, found.world_size) == (1, 2)
    assert found.pod is not None and found.pod.uid == "uid-launcher"
    # Only the pod of the launcher's name is the launcher: a look-alike with another name is not.
    other = {**launcher_pod, "metadata": {**launcher_pod["metadata"], "name": "rn50-launcher-q"}}
    assert observe([other], None, launcher_name=LAUNCHER).launcher is None


def test_observe_reads_a_legacy_launcher_job() -> None:
    """A launcher Job that an earlier release of the operator made: its pod (the Job controller's, with a
    generated name) says how the launch went, and the Job's conditions say it once the pod is gone."""
    launcher_pod = {
        "metadata": {
            "name": "rn50-launcher-q",
            "labels": {"dtjob.io/role": "launcher", "dtjob.io/attempt": "1"},
        },
        "status": {"phase": "Running"},
    }
    job = {
        "metadata": {"name": "rn50-launcher", "labels": {"dtjob.io/attempt": "1"}},
        "status": {"active": 1},
    }
    obs = observe([launcher_pod], job, launcher_name=LAUNCHER)
    assert obs.launcher is not None and obs.launcher.running and obs.launcher.pod_name == "rn50-launcher-q"
    assert obs.launcher.legacy_job
    failed_job = {
        **job,
        "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]},
    }
    failed = observe([], failed_job).launcher
    assert failed is not None and failed.failed and failed.reason == "BackoffLimitExceeded"


def test_worker_that_exits_cleanly_still_breaks_the_world() -> None:
    obs = Observed(pods=(worker(0, phase="Succeeded", ready=False), worker(1)), launcher=launcher())
    d = decide(job_spec(), obs, started(), NOW)
    cond = d.status.condition("Restarting")
    assert cond is not None and "rn50-worker-0 exited" in cond.message


def test_a_legacy_launcher_jobs_pod_outcome_counts_before_the_job_condition() -> None:
    labels = {"dtjob.io/role": "launcher", "dtjob.io/attempt": "0"}
    job = {
        "metadata": {"name": "rn50-launcher", "labels": {"dtjob.io/attempt": "0"}},
        "status": {"active": 1},
    }
    done = {"metadata": {"name": "rn50-launcher-a", "labels": labels}, "status": {"phase": "Succeeded"}}
    state = observe([done], job).launcher
    assert state is not None and state.succeeded and not state.failed
    crashed = {
        "metadata": {"name": "rn50-launcher-b", "labels": labels},
        "status": {"phase": "Failed", "containerStatuses": [
            {"state": {"terminated": {"exitCode": 2, "reason": "Error"}}}]},
    }  # fmt: skip
    state = observe([crashed], job).launcher
    assert state is not None and state.failed and state.reason == "Error, exit code 2"
    # A launcher pod of an older attempt says nothing about this Job.
    old = {"metadata": {"name": "rn50-launcher-c", "labels": {**labels, "dtjob.io/attempt": "7"}},
           "status": {"phase": "Failed"}}  # fmt: skip
    state = observe([old], job).launcher
    assert state is not None and not state.failed and not state.succeeded


def test_a_restart_uploads_the_failed_worlds_logs_before_deleting_it() -> None:
    creds = {"authMode": "accountKey", "secretRef": {"name": "k"}}
    output = {"account": "acct1", "container": "results", "credentials": creds}
    failed = worker(1, phase="Failed", ready=False, reason="Error, exit code 1")
    obs = Observed(pods=(worker(0), failed), launcher=launcher())
    d = decide(job_spec(output=output), obs, started(), NOW)
    assert d.status.phase == "Restarting"
    # Attempt 0's logs first (they say why it failed), then its pods go; the final upload stays pending.
    assert d.actions[0] == UploadLogs(attempt=0)
    assert set(d.actions[1:]) == {DeletePod("rn50-worker-0"), DeletePod("rn50-worker-1"), gone_launcher()}
    assert not d.status.logs_uploaded
    # Without an output there is nowhere to upload to.
    assert not any(isinstance(a, UploadLogs) for a in decide(job_spec(), obs, started(), NOW).actions)


def test_a_deadline_near_int64_max_never_overflows() -> None:
    # The parser and the CRD refuse such values; an older CRD or a direct write must still not crash decide().
    spec = job_spec()
    far = replace(spec, run_policy=replace(spec.run_policy, active_deadline_seconds=2**63 - 1))
    d = decide(far, Observed(pods=(worker(0), worker(1)), launcher=launcher()), started(), NOW)
    assert d.status.phase == "Running"
    assert d.requeue_after is not None and d.requeue_after <= 24 * 3600


def test_a_ttl_near_int64_max_still_cleans_up_a_finished_job() -> None:
    # Before: OverflowError once the launcher completed, so the job stayed Running, holding its workers' GPUs.
    spec = job_spec()
    far = replace(spec, run_policy=replace(spec.run_policy, ttl_seconds_after_finished=2**63 - 1))
    obs = Observed(pods=(worker(0), worker(1)), launcher=launcher(running=False, succeeded=True))
    d = decide(far, obs, started(), NOW)
    assert d.status.phase == "Succeeded"
    assert DeletePod("rn50-worker-0") in d.actions and DeleteJob() not in d.actions


def test_spec_workers_edited_mid_run_applies_at_the_next_world_not_as_a_lost_worker() -> None:
    # The running world was created for 2 workers (its launcher pod says so); the spec now asks for 3.
    obs = Observed(pods=(worker(0), worker(1)), launcher=launcher(world_size=2))
    d = decide(job_spec(workers=3), obs, started(), NOW)
    assert d.status.phase == "Running" and d.status.restarts == 0
    assert d.actions == []  # no third worker beside a running world, no restart
    assert "spec.workers=3 applies at the next world" in (d.status.condition("Running") or d.status).message
    # Shrinking does not delete a rank of the running world either.
    shrunk = decide(job_spec(workers=1), obs, started(), NOW)
    assert shrunk.status.phase == "Running" and DeletePod("rn50-worker-1") not in shrunk.actions


def test_a_launcher_deleted_by_hand_restarts_the_world_and_counts_it() -> None:
    obs = Observed(pods=(worker(0), worker(1)))
    prev = started(launcher_pod=LAUNCHER, launcher_state="Running")
    d = decide(job_spec(), obs, prev, NOW)
    assert d.status.phase == "Restarting" and d.status.restarts == 1
    restarting = d.status.condition("Restarting")
    assert restarting is not None and restarting.reason == "LauncherLost"
    assert "launcher pod rn50-launcher disappeared (it was deleted)" in restarting.message
    # Our own create, not yet in the cache, is not a loss: no launcher pod was ever seen.
    fresh = decide(job_spec(), obs, started(phase="Starting", launcher_state="Pending"), NOW)
    assert fresh.status.restarts == 0
