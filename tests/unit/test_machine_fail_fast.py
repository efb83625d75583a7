"""Fail fast and for the right reason: a world that cannot start fails after runPolicy.startupDeadlineSeconds
(an invalid image at once), and under restartPolicy ExitCode a launcher exit code in the user's range fails
the job without a restart, while signals and infrastructure restart the world."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from dtjob.machine import decide
from dtjob.spec.reader import SpecError
from dtjob.state.decision import DeletePod
from dtjob.state.observed import LauncherState, Observed, PodState, launcher_state, observe_children
from dtjob.state.status import JobStatus
from dtjob.timefmt import format_time

from tests.unit.operator_fixtures import job_spec

NOW = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
PULL = 'ImagePullBackOff: Back-off pulling image "ghcr.io/x/nope:1"'


def pod(name: str, role: str = "worker", index: int | None = 0, **kw: Any) -> PodState:
    fields: dict[str, Any] = {
        "name": name, "role": role, "attempt": 0, "index": index, "phase": "Running", "scheduled": True,
        "ready": True, "deleting": False, "uid": f"uid-{name}", "created": NOW - timedelta(minutes=10),
    }  # fmt: skip
    fields.update(kw)
    return PodState(**fields)


def workers(**kw: Any) -> tuple[PodState, PodState]:
    return pod("rn50-worker-0", index=0, **kw), pod("rn50-worker-1", index=1, **kw)


def failed_launcher(exit_code: int, reason: str = "Error", disruption: str | None = None) -> LauncherState:
    failed = pod(
        "rn50-launcher-x", role="launcher", index=None, phase="Failed", ready=False, exit_code=exit_code,
        termination_reason=reason, reason=f"{reason}, exit code {exit_code}", disruption=disruption,
    )  # fmt: skip
    return LauncherState(
        0, deleting=False, running=False, succeeded=False, failed=True, pod_name=failed.name,
        reason=failed.reason, failed_pod=failed,
    )  # fmt: skip


def running() -> JobStatus:
    return JobStatus(phase="Running", start_time=format_time(NOW - timedelta(minutes=10)), launcher_pod="x")


EXIT_CODE = {"runPolicy": {"restartPolicy": "ExitCode", "backoffLimit": 3}}


def test_a_users_exit_code_fails_the_job_without_a_restart() -> None:
    d = decide(job_spec(**EXIT_CODE), Observed(pods=workers(), launcher=failed_launcher(1)), running(), NOW)
    assert d.status.phase == "Failed" and d.status.restarts == 0
    failed = d.status.condition("Failed")
    assert failed is not None and failed.reason == "LauncherFailed"
    assert "launcher pod rn50-launcher-x failed: Error, exit code 1" in failed.message
    assert "exit code 1 is permanent under runPolicy.restartPolicy ExitCode (permanentExitCodes 1-127)" in (
        failed.message
    )
    # The world is freed (cleanPodPolicy Running): the workers still running go.
    assert (
        DeletePod("rn50-worker-0", "uid-rn50-worker-0") in d.actions
        and DeletePod("rn50-worker-1", "uid-rn50-worker-1") in d.actions
    )


@pytest.mark.parametrize(
    ("launcher", "why"),
    [
        (failed_launcher(137), "a signal (128 + 9)"),
        (failed_launcher(1, reason="OOMKilled"), "out of memory"),
        (failed_launcher(1, disruption="EvictionByEvictionAPI: evicted"), "an eviction"),
    ],
)
def test_signals_and_infrastructure_restart_the_world(launcher: LauncherState, why: str) -> None:
    d = decide(job_spec(**EXIT_CODE), Observed(pods=workers(), launcher=launcher), running(), NOW)
    assert d.status.phase == "Restarting" and d.status.restarts == 1, why


def test_a_broken_world_explains_the_launchers_exit_and_restarts() -> None:
    # The launcher exited 1 because worker 1 failed under it: infrastructure, not the user's code.
    lost = pod("rn50-worker-1", index=1, phase="Failed", ready=False, reason="Error, exit code 255")
    observed = Observed(pods=(workers()[0], lost), launcher=failed_launcher(1))
    d = decide(job_spec(**EXIT_CODE), observed, running(), NOW)
    cond = d.status.condition("Restarting")
    assert d.status.restarts == 1 and cond is not None and cond.reason == "WorkerFailed"
    # A worker that is gone altogether counts the same.
    d = decide(
        job_spec(**EXIT_CODE), Observed(pods=workers()[:1], launcher=failed_launcher(1)), running(), NOW
    )
    assert d.status.restarts == 1


def test_on_failure_and_codes_outside_the_range_restart() -> None:
    d = decide(job_spec(), Observed(pods=workers(), launcher=failed_launcher(1)), running(), NOW)
    assert d.status.phase == "Restarting"
    spec = job_spec(runPolicy={"restartPolicy": "ExitCode", "permanentExitCodes": "2-9,42"})
    assert (
        decide(spec, Observed(pods=workers(), launcher=failed_launcher(1)), running(), NOW).status.restarts
        == 1
    )
    assert decide(
        spec, Observed(pods=workers(), launcher=failed_launcher(42)), running(), NOW
    ).status.phase == ("Failed")


def test_permanent_exit_codes_parse_or_name_the_field() -> None:
    spec = job_spec(runPolicy={"restartPolicy": "ExitCode", "permanentExitCodes": "1-127,255"})
    assert spec.run_policy.permanent_exit_codes == ((1, 127), (255, 255))
    assert spec.run_policy.is_permanent(255) and not spec.run_policy.is_permanent(128)
    for bad, why in (("127-1", "runs backwards"), ("0", "not a list"), ("256", "not a list"), ("1,", "not")):
        with pytest.raises(SpecError) as err:
            job_spec(runPolicy={"permanentExitCodes": bad})
        assert err.value.path == "spec.runPolicy.permanentExitCodes" and why in str(err.value)


def starting(**kw: Any) -> JobStatus:
    return JobStatus(phase="Pending", start_time=format_time(NOW - timedelta(minutes=10)), **kw)


def test_an_image_that_never_pulls_fails_after_the_startup_deadline() -> None:
    spec = job_spec(runPolicy={"startupDeadlineSeconds": 300})
    stuck = pod(
        "rn50-worker-1", index=1, phase="Pending", ready=False, waiting="ImagePullBackOff", reason=PULL,
        created=NOW - timedelta(seconds=200),
    )  # fmt: skip
    observed = Observed(pods=(workers()[0], stuck))
    d = decide(spec, observed, starting(), NOW)
    assert d.status.phase == "Starting"  # scheduled, waiting for its image
    assert d.requeue_after is not None and d.requeue_after <= 100
    later = decide(spec, observed, starting(), NOW + timedelta(seconds=100))
    assert later.status.phase == "Failed"
    failed = later.status.condition("Failed")
    assert failed is not None and failed.reason == "StartupDeadlineExceeded"
    assert failed.message == (
        f"worker pod rn50-worker-1 still cannot start 300s after it was created "
        f"(runPolicy.startupDeadlineSeconds): {PULL}"
    )
    assert DeletePod("rn50-worker-1", "uid-rn50-worker-1") in later.actions  # the GPUs it holds are freed


def test_without_a_deadline_a_stuck_pod_waits_and_an_invalid_image_fails_at_once() -> None:
    stuck = pod("rn50-worker-1", index=1, phase="Pending", ready=False, waiting="ErrImagePull", reason=PULL,
                created=NOW - timedelta(days=3))  # fmt: skip
    d = decide(job_spec(), Observed(pods=(workers()[0], stuck)), starting(), NOW)
    assert d.status.phase == "Starting" and d.requeue_after is None
    invalid = pod("rn50-worker-1", index=1, phase="Pending", ready=False, waiting="InvalidImageName",
                  reason="InvalidImageName: Failed to apply default image tag", created=NOW)  # fmt: skip
    d = decide(job_spec(), Observed(pods=(workers()[0], invalid)), starting(), NOW)
    failed = d.status.condition("Failed")
    assert d.status.phase == "Failed" and failed is not None and failed.reason == "InvalidImageName"
    assert failed.message.startswith("worker pod rn50-worker-1 cannot start: InvalidImageName")


def test_an_unschedulable_launcher_counts_too() -> None:
    spec = job_spec(runPolicy={"startupDeadlineSeconds": 60})
    launcher_pod = pod("rn50-launcher", role="launcher", index=None, phase="Pending", ready=False,
                       scheduled=False, unschedulable=True, reason="Unschedulable: 0/3 nodes are available",
                       created=NOW - timedelta(seconds=61))  # fmt: skip
    launcher = launcher_state(launcher_pod)
    d = decide(spec, Observed(pods=(*workers(), launcher_pod), launcher=launcher), starting(), NOW)
    failed = d.status.condition("Failed")
    assert failed is not None and failed.reason == "StartupDeadlineExceeded"
    assert "launcher pod rn50-launcher " in failed.message
    assert DeletePod("rn50-launcher", "uid-rn50-launcher") in d.actions  # its CPUs (or GPUs) are freed


def test_observe_reads_exit_codes_waiting_reasons_and_creation() -> None:
    def raw(status: dict[str, Any]) -> dict[str, Any]:
        labels = {"dtjob.io/role": "worker", "dtjob.io/attempt": "0", "dtjob.io/worker-index": "0"}
        meta = {"name": "w", "labels": labels, "creationTimestamp": "2025-01-01T11:55:00Z"}
        return {"metadata": meta, "status": status}

    waiting = {"phase": "Pending", "containerStatuses": [{"state": {"waiting": {"reason": "ErrImagePull"}}}],
               "conditions": [{"type": "PodScheduled", "status": "True"}]}  # fmt: skip
    state = observe_children([raw(waiting)], None).pods[0]
    assert state.waiting == "ErrImagePull" and not state.unschedulable
    assert state.created == NOW - timedelta(minutes=5)
    ended = {"phase": "Failed", "containerStatuses": [
        {"state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}  # fmt: skip
    state = observe_children([raw(ended)], None).pods[0]
    assert (state.exit_code, state.termination_reason) == (137, "OOMKilled")
    unschedulable = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                          "reason": "Unschedulable"}]}  # fmt: skip
    assert observe_children([raw(unschedulable)], None).pods[0].unschedulable
